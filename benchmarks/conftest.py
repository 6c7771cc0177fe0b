"""Benchmark options: small sizes by default, the seed's workloads behind --big."""
import pytest

from tests.conftest import cp, gpu_available, pytest_collection_modifyitems  # noqa: F401


def pytest_addoption(parser):
    parser.addoption("--big", action="store_true", default=False,
                     help="run the seed's full-size workloads (n=2M and up)")


@pytest.fixture(scope="session")
def big(request):
    return request.config.getoption("--big")
