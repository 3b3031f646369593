#!/usr/bin/env bash
# On the device machine, from the repository root (main without the patch), logs under $OUT:
#   OUT=/tmp/out bash benchmarks/results/2026-12-02-h200-fwd-turns/tune/run_turn_protocol.sh
# Builds tools/tune/tune_sm90.cu from main and from a copy with turn_protocol.patch applied
# (every TUNE_D), times them alternately (two rounds), then builds the sm_90 wheel of the
# patched copy and runs the forward's GPU tests with it.  Run at c192a76
# (turn_protocol.txt beside it); main has the patch since f5cc3d6, so it no longer applies there.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/turn-out}
mkdir -p "$OUT"
rm -rf /tmp/patched && cp -r . /tmp/patched && (cd /tmp/patched && patch -p1 < "$HERE/turn_protocol.patch") > "$OUT/patch.log"
NV="nvcc -std=c++17 -O3 --use_fast_math -gencode arch=compute_90a,code=sm_90a"
( cd /tmp/patched && FMHA_CUDA_ARCHS=90 python3 -m pip wheel --no-build-isolation --no-deps . -w /tmp/whl > "$OUT/wheel.log" 2>&1 ) &
WPID=$!
PIDS=""
for D in 64 96 128 192 256; do
  $NV -DTUNE_D=$D -Icsrc -Icsrc/include tools/tune/tune_sm90.cu csrc/cuda_fmha/tma.cu -o /tmp/base$D & PIDS="$PIDS $!"
  (cd /tmp/patched && $NV -DTUNE_D=$D -Icsrc -Icsrc/include tools/tune/tune_sm90.cu csrc/cuda_fmha/tma.cu -o /tmp/new$D) & PIDS="$PIDS $!"
done
wait $PIDS
timeout 25 /tmp/new128 > /dev/null || { echo "patched kernel failed or hung"; exit 1; }
for round in 1 2; do
  for D in 64 96 128 192 256; do
    for b in base new; do
      echo "== round $round D=$D $b" >> "$OUT/tune.txt"
      timeout 20 /tmp/$b$D >> "$OUT/tune.txt" 2>&1
    done
  done
done
wait $WPID
echo "tune done, wheel built at $(date +%T)"
python3 -m pip install --no-deps --force-reinstall /tmp/whl/fmha-*.whl > "$OUT/install.log" 2>&1
cp -r tests /tmp/turn-tests && cd /tmp
FMHA_REQUIRE_GPU=1 timeout 240 python3 -m pytest /tmp/turn-tests/test_forward.py /tmp/turn-tests/test_sm90.py /tmp/turn-tests/test_varlen.py /tmp/turn-tests/test_paged_varlen.py /tmp/turn-tests/test_vllm_call.py -q -k cuda -x --tb=short -p no:cacheprovider > "$OUT/gpu_tests.txt" 2>&1
tail -1 "$OUT/gpu_tests.txt"
