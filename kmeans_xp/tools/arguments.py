"""What the `kmeans-xp` options accept, and the checks made before any work: the parser's
one-line errors, sizes ('2M', '1e6'), memory bounds, data sources, the shared flags, the
backend named and the sizes against the host's memory (`preflight`). It prints nothing.
"""
from __future__ import annotations

import argparse
import decimal


class UsageError(Exception):
    """The command line asks for something that cannot be (exit status 2)."""


class Failure(Exception):
    """The command could not do what was asked (exit status 1)."""


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors: `kmeans-xp: error: ...` and exit status 2."""

    def error(self, message):
        self.exit(2, f"kmeans-xp: error: {message} (see: {self.prog} --help)\n")


def parse_size(text, minimum=1) -> int:
    """'2000000', '2_000_000', '2e6', '2M', '200k' or '1.5k' -> int (at least `minimum`)."""
    t = str(text).strip().lower().replace("_", "")
    scale = {"k": 10**3, "m": 10**6, "g": 10**9}.get(t[-1:], 1)
    try:  # Decimal: exact for 999999999999999999 and 1.5k alike
        value = decimal.Decimal(t[:-1] if scale > 1 else t) * scale
    except decimal.InvalidOperation:
        value = decimal.Decimal("nan")
    if not (value.is_finite() and value == value.to_integral_value()
            and minimum <= value <= 10**18):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a count >= {minimum} (e.g. 200000, 200k, 2M, 1e6)")
    return int(value)


def count(text):
    """A size that may be 0 (a seed, warm-up iterations)."""
    return parse_size(text, minimum=0)


def size_list(text):
    """'100k,1M,10M' -> [100000, 1000000, 10000000]."""
    return [parse_size(v) for v in text.split(",") if v.strip()]


def memory_option(text):
    """--max-memory: checked once here ('auto', bytes, '2GB'); the text goes on unchanged."""
    from kmeans_xp.contract.memory import parse_memory
    try:
        parse_memory(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def data_option(text):
    """--data: 'seed', 'blobs' or a .npy path (read later, where its errors are failures)."""
    if text in ("seed", "blobs") or text.endswith(".npy"):
        return text
    raise argparse.ArgumentTypeError(f"{text!r}: give 'seed', 'blobs' or a PATH.npy")


def progress_flag(p):
    """--no-progress, on the commands that show progress."""
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar or progress lines on stderr (the rest still prints)")


def check_memory(args, what, n, d, k, dtype, data="seed", backend="auto"):
    """The sizes against the host's memory before anything is allocated (`preflight`):
    `preflight.TooLarge` (a usage error) when they do not fit; the bytes needed, or None
    where the host's memory is unknown (nothing checked)."""
    from kmeans_xp.tools.preflight import check_host_memory
    return check_host_memory(what, n, d, k, dtype, data=data, backend=backend,
                             max_memory=args.max_memory)


def json_flag(p):
    """--json, on the commands with a machine-readable result."""
    p.add_argument("--json", action="store_true",
                   help="the machine-readable result on stdout; headers, table and progress "
                        "on stderr")


def check_backend(name):
    """Up front: an unknown name is a usage error, a missing library a failure."""
    from kmeans_xp.contract.registry import get_backend
    if name != "auto":
        get_backend(name)  # ValueError (unknown) or BackendNotAvailableError
