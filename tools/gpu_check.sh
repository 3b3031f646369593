#!/usr/bin/env bash
# On a GPU machine (the device tool's H200): build fmha, run the GPU half of the test suite
# and the benchmark, with logs and results under $OUT.  Usage:
#   OUT=/tmp/out tools/gpu_check.sh [quick|full|none] [extra pytest args...]
set -uo pipefail
OUT=${OUT:-gpu-check-out}
MODE=${1:-quick}
shift || true
mkdir -p "$OUT"
export FMHA_CUDA_ARCHS=${FMHA_CUDA_ARCHS:-90}
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"

start=$(date +%s)
if ! python3 -m pip install --no-build-isolation --no-deps -e . > "$OUT/build.log" 2>&1; then
  tail -40 "$OUT/build.log"; exit 1
fi
echo "build (FMHA_CUDA_ARCHS=$FMHA_CUDA_ARCHS): $(( $(date +%s) - start )) s, $(grep -c 'spilled' "$OUT/build.log") kernels with spills"

# Twice: the kernels the dispatch picks (on sm_90, the sm_90a forward and backward), then the mma.sync
# kernels forced everywhere.
for path in default mma_sync; do
  start=$(date +%s)
  FMHA_FORCE_MMA_SYNC=$([ $path = mma_sync ] && echo 1 || echo 0) FMHA_REQUIRE_GPU=1 \
    python3 -m pytest tests -q -k cuda --tb=short --maxfail=40 -p no:cacheprovider "$@" > "$OUT/tests_$path.log" 2>&1
  echo "GPU tests ($path): exit $?, $(( $(date +%s) - start )) s: $(tail -1 "$OUT/tests_$path.log")"
  grep -E "^(FAILED|ERROR)" "$OUT/tests_$path.log" | head -40
done

case "$MODE" in
  none) exit 0 ;;
  full) python3 -m fmha.bench --out "$OUT/bench" > "$OUT/bench.log" 2>&1 ;;
  *) python3 -m fmha.bench --quick --out "$OUT/bench" > "$OUT/bench.log" 2>&1 ;;
esac
echo "bench: exit $?"
tail -30 "$OUT/bench.log"
