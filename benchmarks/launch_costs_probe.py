"""The host's cost of the CUDA calls one short Lloyd pass is made of, on this machine: each
timed alone over many calls (host microseconds per call; "round trip" waits each time)."""
import cupy as cp
import numpy as np
from host_calls import host_us_per_call  # (this script's folder is on sys.path)

rt = cp.cuda.runtime
stream = cp.cuda.get_current_stream()
src = cp.cuda.alloc_pinned_memory(3200)
dst = cp.empty(800, dtype=cp.float32)
stats = cp.zeros(802, dtype=cp.float64)
host = cp.cuda.alloc_pinned_memory(stats.nbytes)
event = cp.cuda.Event(disable_timing=True)
kern = cp.RawKernel(r'''extern "C" __global__ void touch(double* a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) a[i] += 1.0; }''', "touch")
hkern = cp.RawKernel(r'''extern "C" __global__
void to_host(const double* a, unsigned long long p, int n) {
    double* h = (double*)p; int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) h[i] = a[i]; }''',
                     "to_host")
kern((4,), (256,), (stats, np.int32(802)))
hkern((4,), (256,), (stats, np.uint64(host.ptr), np.int32(802)))
cp.cuda.Device().synchronize()


def per_call(label, fn, reps=2000):
    print(f"{label:60s} {host_us_per_call(cp, fn, reps):8.2f} us", flush=True)


per_call("memcpyAsync H2D 3.2 KB pinned", lambda: rt.memcpyAsync(
    dst.data.ptr, src.ptr, 3200, rt.memcpyHostToDevice, stream.ptr))
per_call("memcpyAsync H2D 3.2 KB pinned + stream sync (round trip)", lambda: (rt.memcpyAsync(
    dst.data.ptr, src.ptr, 3200, rt.memcpyHostToDevice, stream.ptr), stream.synchronize()))
per_call("memcpyAsync D2H 6.4 KB pinned + stream sync (round trip)", lambda: (rt.memcpyAsync(
    host.ptr, stats.data.ptr, stats.nbytes, rt.memcpyDeviceToHost, stream.ptr),
    stream.synchronize()))
per_call("stats.get(out=pinned array) (round trip)", lambda: stats.get(
    out=np.frombuffer(host, dtype=np.float64, count=802)))
per_call("Event() creation", lambda: cp.cuda.Event(disable_timing=True))
per_call("event.record()", lambda: event.record(stream))
per_call("event.synchronize() (complete)", lambda: event.synchronize())
per_call("stream.synchronize() (idle)", lambda: stream.synchronize())
per_call("get_current_stream()", lambda: cp.cuda.get_current_stream())
per_call("tiny RawKernel launch", lambda: kern((4,), (256,), (stats, np.int32(802))))
per_call("tiny RawKernel launch + stream sync (round trip)", lambda: (
    kern((4,), (256,), (stats, np.int32(802))), stream.synchronize()))
per_call("kernel writes stats to mapped pinned host + stream sync", lambda: (
    hkern((4,), (256,), (stats, np.uint64(host.ptr), np.int32(802))), stream.synchronize()))
per_call("kernel to host + event record + event sync", lambda: (
    hkern((4,), (256,), (stats, np.uint64(host.ptr), np.int32(802))), event.record(stream),
    event.synchronize()))
per_call("cp.empty(2M, int32)", lambda: cp.empty(2_000_000, dtype=cp.int32))
per_call("cupy slice out[600:]", lambda: stats[600:])
print("mapped write ok:", np.allclose(np.frombuffer(host, dtype=np.float64, count=802),
                                      stats.get()))
