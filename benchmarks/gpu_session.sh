#!/usr/bin/env bash
# One device session: install the carried wheels, then run the steps named on the command
# line, each logging under $OUT. Steps: machine, old (time the code in .device/old),
# tests (GPU tests), new (time this checkout), profile (where a fit's time goes),
# cpu (CPU rows vs scikit-learn, faiss), scaling (NumPy primitives by thread count),
# freemem (what outlives a free_memory fit), w1 (W1 cupy-fused, old and new alternately),
# w1centers (the same, the new code with the center math on the host and on the device),
# w1host (cProfile of W1 cupy-fused fits, and the GPU time of one iteration), w1line (one
# W1 fit's host timeline, and each host piece of an iteration timed alone; w5line: a W5 tf32
# fit's), launch (the host
# cost of each CUDA call a short pass is made of), memedges (device-X fits' pool peaks against
# estimate_memory under a 15 GiB limit), init (k-means++ and k-means|| seconds),
# firstuse (a fresh process's first fit, cold and warm kernel cache, profiled),
# streamcheck (the streamed mean and fits of a 12 GB host X against NumPy's and in-memory),
# streamfit (whole fits of a 12 GB host X under a 15 GiB pool limit), upload (NumPy X to the
# device and labels back by staging chunk and buffers, and fits at n=200M from NumPy), minibatch
# (MiniBatchKMeans against scikit-learn's, on the CPU and the GPU, and over a 12 GB memmap), some (the GPU tests in $TEST_FILES),
# fused (probe_fused.py, $FUSED_ARGS), ncu (Nsight Compute on the small-d kernel, $NCU_OPTS),
# mma (mma_probe.py, the tensor-core kernels, $MMA_ARGS), w5parts (a W5 iteration's device
# time by part, w5_parts.py), cputests (CPU tests in $CPU_TEST_FILES on the device's cores),
# workers (the numpy backend's worker processes pass by pass, workers_probe.py),
# pack (everything under $OUT into one session.tgz: the device returns a few files only).
#   bash benchmarks/gpu_session.sh machine old tests new
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .device/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
ROOT=$(pwd)
installed=0
install_new() {
  if [ $installed = 0 ]; then
    python3 -m pip install -q --no-deps --no-build-isolation -e . && installed=1
  fi
}
pass=0
install_old() {  # the old code (.device/old) beside the new, in /tmp/old
  [ -d /tmp/old/kmeans_xp ] || python3 -m pip install -q --no-deps --no-build-isolation \
    --target /tmp/old .device/old > "$OUT/old_install.log" 2>&1
}
for step in "$@"; do
  pass=$((pass + 1))
  echo "=== $step $(date +%T)"
  case $step in
    machine)
      { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
        python3 -c "import cupy, numpy, sys; print('cupy', cupy.__version__, 'numpy',
numpy.__version__, 'cuda runtime', cupy.cuda.runtime.runtimeGetVersion(), 'python',
sys.version.split()[0])"
        nproc; date -u; git -C "$ROOT" log --oneline -1 2>/dev/null
        lscpu 2>/dev/null | grep -E "^(Model name|Thread|Core|Socket|CPU\(s\)|NUMA node|L[123])"; } > "$OUT/machine.txt" 2>&1
      cat "$OUT/machine.txt" ;;
    old)
      install_old
      (cd /tmp && PYTHONPATH=/tmp/old:/tmp/site python3 "$ROOT/benchmarks/regression_probe.py" \
        --label old ${OLD_ARGS:---init --repeats 2} --out "$OUT/regression_old$pass.json") > "$OUT/regression_old$pass.log" 2>&1
      tail -n 3 "$OUT/regression_old$pass.log" ;;
    tests)
      install_new
      timeout ${TEST_TIMEOUT:-420} python3 -m pytest -m gpu -q -p no:cacheprovider tests \
        > "$OUT/gpu_tests.log" 2>&1
      tail -n 15 "$OUT/gpu_tests.log" ;;
    new)
      install_new
      python3 benchmarks/regression_probe.py --label new ${NEW_ARGS:---init --repeats 2} --out "$OUT/regression_new$pass.json" \
        > "$OUT/regression_new$pass.log" 2>&1
      tail -n 3 "$OUT/regression_new$pass.log" ;;
    profile)
      install_new
      timeout ${PROFILE_TIMEOUT:-240} python3 benchmarks/fit_profile.py --out "$OUT/fit_profile.txt" \
        > "$OUT/fit_profile.log" 2>&1
      tail -n 5 "$OUT/fit_profile.log" ;;
    micro)
      install_new
      timeout 200 python3 benchmarks/micro_probe.py --out "$OUT/micro_probe.txt" > "$OUT/micro_probe.log" 2>&1
      tail -n 8 "$OUT/micro_probe.log" ;;
    main)
      install_new
      rm -rf kmeans_xp_results
      s0=$SECONDS
      timeout 170 python3 -m kmeans_xp > "$OUT/main_job.log" 2>&1
      echo "main job wall $((SECONDS - s0)) s" >> "$OUT/main_job.log"
      tail -n 2 "$OUT/main_job.log"; cp -r kmeans_xp_results "$OUT/main_job_results" 2>/dev/null
      grep -i "speed\|x over\|wall" "$OUT/main_job.log" | tail -n 5 ;;
    debug)
      install_new
      timeout 120 python3 benchmarks/debug_duplicates.py > "$OUT/debug_duplicates.log" 2>&1
      tail -n 4 "$OUT/debug_duplicates.log" ;;
    w1)
      install_new
      install_old
      for r in 1 2 3 4 5; do
        (cd /tmp && PYTHONPATH=/tmp/old:/tmp/site timeout 60 python3 "$ROOT/benchmarks/w1_fused_probe.py" old 10) >> "$OUT/w1_fused.jsonl" 2>>"$OUT/w1_fused.err"
        timeout 60 python3 benchmarks/w1_fused_probe.py new 10 >> "$OUT/w1_fused.jsonl" 2>>"$OUT/w1_fused.err"
      done
      cat "$OUT/w1_fused.jsonl" ;;
    w1centers)
      install_new
      install_old
      for r in $(seq ${W1_ROUNDS:-6}); do
        (cd /tmp && PYTHONPATH=/tmp/old:/tmp/site timeout 60 python3 "$ROOT/benchmarks/w1_fused_probe.py" old 8) >> "$OUT/w1_centers.jsonl" 2>>"$OUT/w1_centers.err"
        timeout 60 python3 benchmarks/w1_fused_probe.py new 8 --centers both >> "$OUT/w1_centers.jsonl" 2>>"$OUT/w1_centers.err"
      done
      cat "$OUT/w1_centers.jsonl" ;;
    w1host)
      install_new
      timeout 120 python3 benchmarks/w1_host_profile.py > "$OUT/w1_host_profile.log" 2>&1
      grep -A 12 "lloyd_iter\|fit:" "$OUT/w1_host_profile.log" | tail -n 6 ;;
    w1line)
      install_new
      timeout 120 python3 benchmarks/w1_timeline.py > "$OUT/w1_timeline.log" 2>&1
      tail -n 14 "$OUT/w1_timeline.log" ;;
    w5line)
      install_new
      timeout 120 python3 benchmarks/w1_timeline.py W5 '{"precision": "tf32"}' > "$OUT/w5_timeline.log" 2>&1
      grep -c relocate_empty "$OUT/w5_timeline.log"; head -n 1 "$OUT/w5_timeline.log" ;;
    launch)
      install_new
      timeout 60 python3 benchmarks/launch_costs_probe.py > "$OUT/launch_costs.log" 2>&1
      cat "$OUT/launch_costs.log" ;;
    memedges)
      install_new
      timeout 300 python3 benchmarks/memory_edges_probe.py > "$OUT/memory_edges.jsonl" 2> "$OUT/memory_edges.err"
      cat "$OUT/memory_edges.jsonl"; tail -n 3 "$OUT/memory_edges.err" ;;
    some)
      install_new
      timeout ${TEST_TIMEOUT:-300} python3 -m pytest -m gpu -q -p no:cacheprovider ${TEST_FILES} \
        > "$OUT/gpu_some_tests.log" 2>&1
      tail -n 8 "$OUT/gpu_some_tests.log" ;;
    w1parts)
      install_new
      timeout 120 python3 benchmarks/w1_breakdown.py > "$OUT/w1_breakdown.log" 2>&1
      cat "$OUT/w1_breakdown.log" | tail -n 4 ;;
    init)
      install_new
      timeout ${INIT_TIMEOUT:-200} python3 benchmarks/init_probe.py ${INIT_ARGS:-} --out "$OUT/init_probe.json" > "$OUT/init_probe.log" 2>&1
      tail -n 6 "$OUT/init_probe.log" ;;
    firstuse)
      install_new
      timeout ${FIRSTUSE_TIMEOUT:-200} python3 benchmarks/first_use_probe.py ${FIRSTUSE_ARGS:-} --out "$OUT/first_use.txt" > "$OUT/first_use.log" 2>&1
      cat "$OUT/first_use.log" | cut -c1-300 ;;
    streamcheck)
      install_new
      timeout ${STREAMCHECK_TIMEOUT:-280} python3 benchmarks/stream_check_probe.py ${STREAMCHECK_ARGS:-} > "$OUT/stream_check.log" 2>&1
      cut -c1-700 "$OUT/stream_check.log" | tail -n 12 ;;
    streamfit)
      install_new
      timeout ${STREAMFIT_TIMEOUT:-300} python3 benchmarks/stream_fit_probe.py ${STREAMFIT_ARGS:-} --out "$OUT/stream_fit.json" > "$OUT/stream_fit.log" 2>&1
      tail -n 5 "$OUT/stream_fit.log" ;;
    pack)
      (cd "$OUT" && tar czf ../session.tgz . && rm -rf ./* && mv ../session.tgz .) ;;
    scaling)
      install_new
      timeout 240 python3 benchmarks/cpu_scaling_probe.py --out "$OUT/cpu_scaling.json" > "$OUT/cpu_scaling.log" 2>&1
      tail -n 20 "$OUT/cpu_scaling.log" ;;
    freemem)
      install_new
      timeout 100 python3 benchmarks/debug_free_memory.py > "$OUT/debug_free_memory.log" 2>&1
      tail -n 12 "$OUT/debug_free_memory.log" ;;
    minibatch)
      install_new
      timeout ${MINIBATCH_TIMEOUT:-280} python3 benchmarks/minibatch_probe.py ${MINIBATCH_ARGS:-} --memmap-dir /tmp --out "$OUT/minibatch_probe.json" > "$OUT/minibatch_probe.log" 2>&1
      tail -n 12 "$OUT/minibatch_probe.log" | cut -c1-300 ;;
    upload)
      install_new
      timeout ${UPLOAD_TIMEOUT:-150} python3 benchmarks/upload_probe.py ${UPLOAD_ARGS:-} --out "$OUT/upload_probe.json" > "$OUT/upload_probe.log" 2>&1
      tail -n 4 "$OUT/upload_probe.log" | cut -c1-400 ;;
    fused)
      install_new
      timeout ${FUSED_TIMEOUT:-240} python3 benchmarks/probe_fused.py "$OUT/probe_fused$pass.json" ${FUSED_ARGS:-} > "$OUT/probe_fused$pass.log" 2>&1
      grep -v "^ *fit:" "$OUT/probe_fused$pass.log" | cut -c1-150 | tail -n 30 ;;
    ncu)
      install_new
      for o in ${NCU_OPTS:-'{}' '{"center_group":1}'}; do
        (cd benchmarks && timeout ${NCU_TIMEOUT:-120} ncu --clock-control none \
          --kernel-name regex:${NCU_KERNEL:-assign_small} --launch-skip 1 --launch-count 1 \
          --section SpeedOfLight --section Occupancy --section WarpStateStats \
          --section SchedulerStats --section InstructionStats --section ComputeWorkloadAnalysis ${NCU_EXTRA:-} \
          python3 ncu_small.py "$o" ${NCU_SHAPE:-}) >> "$OUT/ncu_${NCU_KERNEL:-assign_small}.txt" 2>&1
      done
      grep -E "^  [a-z_]+<|Issue Slots Busy|Executed Ipc Active|Achieved Occupancy|Duration|Registers Per|Theoretical Occ|No Eligible|Stall" "$OUT/ncu_${NCU_KERNEL:-assign_small}.txt" | head -n 40 ;;
    mma)
      install_new
      timeout ${MMA_TIMEOUT:-200} python3 benchmarks/mma_probe.py "$OUT/mma_probe$pass.json" ${MMA_ARGS:-} > "$OUT/mma_probe$pass.log" 2>&1
      tail -n 25 "$OUT/mma_probe$pass.log" | cut -c1-200 ;;
    w5parts)
      install_new
      timeout 240 python3 benchmarks/w5_parts.py "$OUT/w5_parts.json" > "$OUT/w5_parts.log" 2>&1
      tail -n 6 "$OUT/w5_parts.log" | cut -c1-300 ;;
    cpuparts)
      install_new
      (cd benchmarks && timeout 200 python3 cpu_fit_parts.py ${PARTS_ARGS:-}) > "$OUT/cpu_fit_parts.log" 2>&1
      cat "$OUT/cpu_fit_parts.log" ;;
    stages)
      install_new
      for w in ${STAGE_WORKLOADS:-W1 d128}; do for t in "" "--threads 1"; do
        timeout 150 python3 benchmarks/numpy_stages.py $w $t --iters 5 >> "$OUT/numpy_stages.log" 2>&1
      done; done
      grep "wall" "$OUT/numpy_stages.log" ;;
    workers)
      install_new
      (cd benchmarks && timeout 300 python3 workers_probe.py ${WORKERS_ARGS:-} \
        --out "$OUT/workers_probe$pass.json") > "$OUT/workers_probe$pass.log" 2>&1
      cat "$OUT/workers_probe$pass.log" | cut -c1-400 ;;
    cputests)
      install_new
      timeout ${CPU_TEST_TIMEOUT:-240} python3 -m pytest -q -p no:cacheprovider \
        ${CPU_TEST_FILES:-tests/test_numpy_workers.py} > "$OUT/cpu_tests.log" 2>&1
      tail -n 3 "$OUT/cpu_tests.log" ;;
    cpu)
      install_new
      python3 benchmarks/cpu_probe.py ${CPU_ARGS:-} --out "$OUT/cpu_probe.json" > "$OUT/cpu_probe.log" 2>&1
      tail -n 5 "$OUT/cpu_probe.log" ;;
  esac
done
