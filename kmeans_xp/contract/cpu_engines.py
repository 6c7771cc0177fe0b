"""Which CPU engine `backend="auto"` takes for NumPy input, and why: a table read top to bottom,
the first row whose conditions hold decides (`choose`), as cupy-fused's kernel-path table does
for its kernels.

The engines: numba's fused pass (X read once an iteration; distances in registers for
d <= 8, else GEMM tiles) and the numpy backend (BLAS GEMM per row chunk). Where numba's
register kernels save the most against the numpy backend's GEMM of K = d, at d <=
NARROW_MAX_D, a whole fit repays numba's first use soonest; at d 5 to 8 a driver iteration
saved 0.04-0.5 ns a unit of work (n 10k-200k, k 8-4096, 2 threads: `python
benchmarks/time_kernels.py --backends numpy,numba`), too little for that row: those fits
take the rows for any d. Warm, numba is the faster one or about even wherever the surface
sweep measured (`python benchmarks/surface.py`, section surface-cpu of
benchmarks/results/<kind>.md); what it costs is its first use in a process (importing numba
and SciPy, loading its cached kernels: 1-2 s), which a fit repays only when it does enough
work. So a row asks for the work of one iteration (n * k * d) or of the whole fit (times the
iterations it may run), counting the whole-fit work of the fits the process ran on numpy
under auto before (`Query.fit_work`): a process of many small fits takes numba once they
would have repaid it.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

#: numba's narrow kernel takes d up to this (kmeans_xp_backends.numba.backend.NARROW_D)
NARROW_MAX_D = 4
#: whole-fit work n * k * d * iterations from which numba's narrow kernel repays its first use
#: (1-2 s) at d <= NARROW_MAX_D: it saves about 5 ns a unit of work against the numpy
#: backend's GEMM of K = d, 3-5x faster (figure: surface-cpu, benchmarks/results/cpu-2core.md)
NARROW_NUMBA_MIN_FIT_WORK = 3 * 10**8
#: from this few clusters down, numba's pass is 3-7x the numpy backend at every d measured (the
#: numpy backend's GEMM of so few columns is mostly its per-chunk cost): about 1.3 ns saved a
#: unit of work, so from this whole-fit work it repays numba's first use (figure: surface-cpu,
#: k = 8 rows, benchmarks/results/cpu-2core.md)
SMALL_K_MAX = 16
SMALL_K_NUMBA_MIN_FIT_WORK = 15 * 10**8
#: below this n * k * d an iteration, numba's first use in a process costs more than the numpy
#: backend's whole fit at d > NARROW_MAX_D, where the two are within 20% of each other warm
#: (figure: W1 and surface-cpu rows of benchmarks/results/<kind>.md)
AUTO_NUMBA_MIN_WORK = 10**8


class Query(NamedTuple):
    n: int
    d: int
    k: int
    iterations: int   # Lloyd iterations the fit may run (1: one pass, e.g. predict)
    threads: int      # the threads the fit may use
    numba_loaded: bool = False   # numba's kernels already loaded in this process
    process_work: int = 0   # whole-fit work this process ran on numpy under auto before

    @property
    def fit_work(self) -> int:
        """The whole fit's work, with the process's earlier numpy fits: numba's first use
        is a process's, so fits that each repay too little of it repay it together (the
        ski-rental rule: take numba once the work run without it would have paid it)."""
        return self.work * self.iterations + self.process_work

    @property
    def work(self) -> int:
        return self.n * self.k * max(self.d, 1)


class Row(NamedTuple):
    """When `holds(query)`, the engines in `order` (those not listed are left out)."""
    order: tuple[str, ...]
    holds: Callable[[Query], bool]
    why: str


CPU_ENGINES = (
    Row(("numba", "numpy"), lambda q: q.numba_loaded,
        "numba's kernels are loaded in this process: their first use is paid, and warm "
        "numba is the faster engine or within 15% (surface-cpu, its auto / best own column)"),
    Row(("numba", "numpy"),
        lambda q: q.d <= NARROW_MAX_D and q.fit_work >= NARROW_NUMBA_MIN_FIT_WORK,
        f"d <= {NARROW_MAX_D}: numba's narrow kernel, 3-5x the numpy backend, repays its "
        f"first use from n*k*d*iterations >= {NARROW_NUMBA_MIN_FIT_WORK:.0e} (the process's "
        f"earlier numpy fits counted)"),
    Row(("numba", "numpy"),
        lambda q: q.k <= SMALL_K_MAX and q.fit_work >= SMALL_K_NUMBA_MIN_FIT_WORK,
        f"k <= {SMALL_K_MAX}: numba's pass, 3-7x the numpy backend's GEMM of few columns, "
        f"repays its first use from n*k*d*iterations >= {SMALL_K_NUMBA_MIN_FIT_WORK:.0e} (the "
        f"process's earlier numpy fits counted)"),
    Row(("numpy",),
        lambda q: q.work < AUTO_NUMBA_MIN_WORK,
        f"n*k*d < {AUTO_NUMBA_MIN_WORK:.0e}: numba's first use in a process would cost "
        f"more than this fit"),
    Row(("numba", "numpy"), lambda q: True,
        "numba's fused pass: X read once an iteration"),
)


def choose(n: int, d: int, k: int, *, iterations: int = 1, threads: int = 1,
           numba_loaded: bool = False, process_work: int = 0) -> Row:
    """The row of CPU_ENGINES a problem takes."""
    q = Query(int(n), int(d), int(k), max(1, int(iterations)), max(1, int(threads)),
              bool(numba_loaded), int(process_work))
    return next(row for row in CPU_ENGINES if row.holds(q))


def arrange(candidates: list[str], n: int, d: int, k: int, *, iterations: int = 1,
            threads: int = 1, numba_loaded: bool = False,
            process_work: int = 0) -> tuple[list[str], str]:
    """(candidates with the CPU engines in the table's order, the row's reason): engines the
    row leaves out are removed, the rest of the candidates (GPU backends first) stay."""
    row = choose(n, d, k, iterations=iterations, threads=threads,
                 numba_loaded=numba_loaded, process_work=process_work)
    engines = [c for c in candidates if c in ("numba", "numpy")]
    if not engines:
        return list(candidates), ""
    ordered = iter([e for e in row.order if e in engines])
    out: list[str] = []
    for c in candidates:
        if c not in ("numba", "numpy"):
            out.append(c)
        else:
            nxt = next(ordered, None)
            if nxt is not None:
                out.append(nxt)
    return out, row.why
