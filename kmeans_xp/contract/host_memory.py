"""How much memory the host has and has free, on every platform, or a plain "unknown".

psutil (an optional extra: ``pip install psutil``, in the ``bench`` extra) answers on Linux,
macOS and Windows alike. Without it, Linux's /proc/meminfo answers (MemAvailable: free plus
reclaimable page cache), then POSIX sysconf where the platform has the names. Where none
answers, the figures are None and `source` says so and what to install: nothing here invents
a size.
"""
from __future__ import annotations

import os
from typing import NamedTuple, Optional

#: what `HostMemory.source` says when no figure is known
UNKNOWN = "unknown: neither psutil nor /proc/meminfo nor sysconf answers (pip install psutil)"


class HostMemory(NamedTuple):
    available: Optional[int]   # bytes a new allocation can take without swapping; None: unknown
    total: Optional[int]       # physical memory in bytes; None: unknown
    source: str                # "psutil", "/proc/meminfo", "sysconf" or UNKNOWN

    @property
    def known(self) -> bool:
        return self.available is not None


def host_memory() -> HostMemory:
    """The host's available and total memory, from the first source that answers."""
    for probe in (_psutil, _proc_meminfo, _sysconf):
        found = probe()
        if found is not None and found.available is not None:
            return found
    return HostMemory(None, None, UNKNOWN)


def _psutil():
    try:
        import psutil
    except ImportError:
        return None
    try:
        vm = psutil.virtual_memory()
    except Exception:  # noqa: BLE001 - a sandbox that hides the figures: try the next source
        return None
    return HostMemory(int(vm.available), int(vm.total), "psutil")


def _proc_meminfo():
    fields = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("MemAvailable", "MemTotal"):
                    fields[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    if "MemAvailable" not in fields:
        return None
    return HostMemory(fields["MemAvailable"], fields.get("MemTotal"), "/proc/meminfo")


def _sysconf():
    try:
        page = os.sysconf("SC_PAGE_SIZE")
        free = os.sysconf("SC_AVPHYS_PAGES") * page
    except (ValueError, OSError, AttributeError):  # macOS and Windows lack the names
        return None
    try:
        total = os.sysconf("SC_PHYS_PAGES") * page
    except (ValueError, OSError, AttributeError):
        total = None
    return HostMemory(int(free), total, "sysconf")
