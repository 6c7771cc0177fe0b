"""The host's time per call, for the probes of a short pass's turn-around
(`launch_costs_probe.py`, `w1_timeline.py`)."""
import time


def host_us_per_call(cp, fn, reps=1000):
    """Microseconds of host time per fn() call, after one warm-up: the device is synchronised
    before the clock starts and after it stops, so the device's work counts only where fn
    waits for it."""
    fn()
    cp.cuda.Device().synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    t = (time.perf_counter() - t0) / reps
    cp.cuda.Device().synchronize()
    return t * 1e6
