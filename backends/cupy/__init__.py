"""The CuPy backends of kmeans_xp, one package: `kernels` (cupy-kernels), `chunked`
(cupy-chunked), `fused` (cupy-fused), the device collaborators they share (`placement`,
`budget`, `base`), the kernel launchers (`nearest`, `reductions`, `fused_plan`) and host
streaming (`streaming`, `staging`). CUDA sources are files under `cuda/`, with one helper
header (`cuda/common.cuh`) included by all.

Nothing here imports CuPy at import time: it is imported when a backend is instantiated.
"""
