"""Sphinx configuration: pydata-sphinx-theme, numpydoc API pages, a sphinx-gallery of the
examples under ../examples, and the Markdown pages through MyST.

    python -m sphinx -W -b html docs docs/_build/html      # warnings are errors, as in CI

Gallery scripts named plot_*.py run during the build; gpu_*.py run only where CuPy sees a GPU
(elsewhere they are shown without their output).
"""
from __future__ import annotations

import sys
from pathlib import Path

import kmeans_xp

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent

project = "kmeans_xp"
author = "the kmeans_xp developers"
copyright = "the kmeans_xp developers"
release = kmeans_xp.__version__
version = ".".join(release.split(".")[:2])

extensions = [
    "myst_parser",
    "numpydoc",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx_gallery.gen_gallery",
    "matplotlib.sphinxext.plot_directive",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
templates_path = ["_templates"]
exclude_patterns = ["_build", "generated/*.md", "auto_examples/*.ipynb",
                    "auto_examples/*.py", "auto_examples/*.zip", "auto_examples/*.json"]

# -- MyST: the Markdown pages keep their GitHub form --------------------------------------
myst_enable_extensions = ["colon_fence", "deflist"]
# "#device-plugins" style links to headings, as on GitHub
myst_heading_anchors = 3
# shell blocks without a language (```), pip commands and outputs: shown as text
highlight_language = "text"

# -- API reference --------------------------------------------------------------------------
autosummary_generate = True
autodoc_default_options: dict[str, object] = {}  # the templates say what each page lists
autodoc_typehints = "none"          # numpydoc's Parameters sections carry the types
numpydoc_show_class_members = False  # autosummary's class template lists them
numpydoc_class_members_toctree = False
# numpydoc's own validation runs in tests/test_docstrings.py; here only cross-references
numpydoc_xref_param_type = False


# -- gallery ------------------------------------------------------------------------------
def _gpu_present() -> bool:
    try:
        import cupy
        return bool(cupy.cuda.runtime.getDeviceCount())
    except Exception:
        return False


sphinx_gallery_conf = {
    "examples_dirs": str(ROOT / "examples"),
    "gallery_dirs": "auto_examples",
    # which scripts run: CPU examples always, GPU examples where there is a GPU
    "filename_pattern": r"/(plot|gpu)_" if _gpu_present() else r"/plot_",
    "ignore_pattern": r"__init__\.py|/_",
    "download_all_examples": False,
    "within_subsection_order": "FileNameSortKey",
    "remove_config_comments": True,
    "plot_gallery": "True",
    # a failing example fails the build
    "only_warn_on_example_error": False,
    "abort_on_example_error": True,
}

# -- the results page: matplotlib's plot directive reads benchmarks/results ----------------
plot_working_directory = str(DOCS)
plot_include_source = False
plot_html_show_source_link = False
plot_html_show_formats = False
plot_formats = [("png", 100)]

# -- HTML -----------------------------------------------------------------------------------
html_theme = "pydata_sphinx_theme"
html_title = f"kmeans_xp {release}"
html_theme_options = {
    "navigation_with_keys": False,
    # the same repository as pyproject.toml's [project.urls] and the README
    "github_url": "https://github.com/kmeans-xp/kmeans_xp",
    "show_toc_level": 2,
    "secondary_sidebar_items": ["page-toc"],
    "footer_start": ["copyright"],
    "footer_end": ["sphinx-version"],
}
html_static_path: list[str] = []
html_show_sourcelink = False

sys.path.insert(0, str(DOCS))
from results_page import setup as _results_setup  # noqa: E402 - needs DOCS on sys.path


def setup(app):
    _results_setup(app, ROOT / "benchmarks" / "results")
