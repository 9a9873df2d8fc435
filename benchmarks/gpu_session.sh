#!/usr/bin/env bash
# A GPU session in parts that each fit one device command (600 s at most), logs under $OUT (or ./gpu-out).
# Run from the repository root on a machine with an NVIDIA GPU, CuPy and torch installed.
#
#   bash benchmarks/gpu_session.sh tests [K/N]    the `gpu` tests (part K of N: tests/device_session.py's
#                                                --shard); each failure goes to $OUT/failures.txt as it happens
#   bash benchmarks/gpu_session.sh benchmarks     the GPU benchmarks (WITH_NORM_PROJ=1 adds bench_norm_proj)
#   bash benchmarks/gpu_session.sh overhead       what checking costs (torch decode loop eager and compiled, native
#                                                 and Python paths, the sanitizer beside; the CuPy loop), and Ctrl-C
#                                                 during `streamcheck run` (benchmarks/probe_interrupts.py)
#   bash benchmarks/gpu_session.sh observer       what the native observer's CPU-built changes wait for (docs/
#                                                 gpu-results.md): its GPU tests and the compiled model through it,
#                                                 the thread-queue program on both paths, the decode loop's overhead
#
# STREAMCHECK_NATIVE_RECORD=1 in the environment runs the tests through the native torch observer (opt-in until
# the whole suite has passed through it: `STREAMCHECK_NATIVE_RECORD=1 bash benchmarks/gpu_session.sh tests 1/2`).
#
# The whole `gpu` suite took about 10 minutes on the H200 with 8-14 xdist workers (2026-12-02), so it runs as
# `tests 1/2` and `tests 2/2`.
set -uo pipefail
what=${1:-}
shard=${2:-}
case $what in
  tests|benchmarks|overhead|observer) ;;
  *) echo "usage: bash benchmarks/gpu_session.sh tests [K/N] | benchmarks | overhead | observer" >&2; exit 2 ;;
esac
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || echo "install failed; using PYTHONPATH"
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import cupy, torch, transformers; print('cupy', cupy.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)" | tee -a "$OUT/gpu.txt"
step() {  # step NAME LIMIT_S COMMAND...: run with a time limit, log to $OUT/NAME.log
  local name=$1 limit=$2; shift 2
  echo "=== $name: $*"
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  echo "=== $name: exit $?"; tail -n 25 "$OUT/$name.log"
}
if [ "$what" = tests ]; then
  step "pytest_gpu${shard:+_${shard%/*}}" 540 python3 -m pytest -m gpu -n 8 -v -p no:cacheprovider -o addopts="" \
    -p tests.device_session ${shard:+--shard "$shard"} --failures-log "$OUT/failures.txt" tests/
  exit 0
fi
if [ "$what" = observer ]; then
  step observer_tests 240 env STREAMCHECK_NATIVE_RECORD=1 python3 -m pytest -m gpu -n 8 -v -p no:cacheprovider \
    -o addopts="" -p tests.device_session --failures-log "$OUT/failures.txt" \
    tests/streamcheck/record/adapters/test_torch_native_gpu.py tests/flashnorm_kernels/test_hf_cuda_compile_gpu.py
  for switch in 1 0; do
    step "thread_queue_native_$switch" 60 env STREAMCHECK_NATIVE_RECORD=$switch python3 -m pytest -m gpu -v \
      -p no:cacheprovider -o addopts="" tests/streamcheck/record/adapters/test_torch_programs_gpu.py \
      -k thread_queue_without_event
  done
  step bench_torch_overhead 240 python3 benchmarks/bench_torch_overhead.py \
    --modes plain,streamcheck,streamcheck-python,sanitizer,compiled,compiled-streamcheck --steps 200 --repeats 5
  exit 0
fi
if [ "$what" = overhead ]; then
  step bench_torch_overhead 300 python3 benchmarks/bench_torch_overhead.py \
    --modes plain,streamcheck,streamcheck-python,sanitizer,compiled,compiled-streamcheck --steps 200 --repeats 5
  step bench_instrument 120 python3 benchmarks/bench_instrument_overhead.py --repeats 7
  step probe_interrupts 200 python3 benchmarks/probe_interrupts.py --runs 10 --after 2 10
  exit 0
fi
if [ "${WITH_NORM_PROJ:-0}" = 1 ]; then
  step bench_norm_proj 100 python3 benchmarks/bench_norm_proj.py --repeats 15
fi
step bench_sim 45 python3 benchmarks/bench_sim.py --ops 50000 --repeats 5 --policy random
step bench_instrument 70 python3 benchmarks/bench_instrument_overhead.py --repeats 7
step repro_gpu 70 python3 -m streamcheck.cli repro implicit-join --backend cupy --tokens 200 --timeline "$OUT/repro_gpu.png"
# End-to-end decode, 7B-shaped random model (bench_e2e_decode.py keeps itself to --budget-s 210).
step bench_e2e_decode 300 env OUT="$OUT" python3 benchmarks/bench_e2e_decode.py
