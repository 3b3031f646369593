#!/bin/bash
# Device A/B for the sm_90a forward's warp-uniform roles (kUniformRoles, on at D = 64), one
# call on the H200, from the repository root (to try D = 96, widen the trait's condition first):
#   OUT=$OUT bash tools/tune/uniform_roles_fwd.sh          (~3 min: A/B only)
#   OUT=$OUT TESTS=1 bash tools/tune/uniform_roles_fwd.sh  (+ wheel build and the sm_90a GPU tests, ~5 min more)
# The base tree is this one with kUniformRoles forced off; both builds time the tiles the
# library dispatches (tune_sm90.cu -DTUNE_DISPATCHED) and print O's bits (-DTUNE_CHECKSUM),
# which must match between base and ur.
set -euo pipefail
OUT=${OUT:-/tmp/uniform_roles_out}
mkdir -p "$OUT"
REPO=$PWD
rm -rf /tmp/ur_base && mkdir -p /tmp/ur_base && cp -r csrc /tmp/ur_base/
sed -i 's/static constexpr bool kUniformRoles = kHeadDim <= 64 \&\& !kFp8;/static constexpr bool kUniformRoles = false;/' \
  /tmp/ur_base/csrc/cuda_fmha/fwd_sm90_kernel.h
grep -q "kUniformRoles = false" /tmp/ur_base/csrc/cuda_fmha/fwd_sm90_kernel.h
for D in 64 96; do
  for t in base ur; do
    tree=$([ $t = base ] && echo /tmp/ur_base || echo "$REPO")
    nvcc -std=c++17 -O3 --use_fast_math -gencode arch=compute_90a,code=sm_90a -DTUNE_D=$D -DTUNE_DISPATCHED \
      -DTUNE_CHECKSUM -I"$tree/csrc" -I"$tree/csrc/include" tools/tune/tune_sm90.cu "$tree/csrc/cuda_fmha/tma.cu" \
      -o /tmp/tune_ur_${t}_$D &
  done
done
wait
for r in 1 2; do
  for D in 64 96; do
    for t in base ur; do echo "== round $r D=$D $t"; /tmp/tune_ur_${t}_$D $t; done
  done
done 2>&1 | tee "$OUT/uniform_roles_fwd_ab.txt"
if [ "${TESTS:-0}" = 1 ]; then
  FMHA_CUDA_ARCHS=90 python3 -m pip wheel --no-build-isolation --no-deps . -w /tmp/ur_whl > "$OUT/wheel.log" 2>&1
  python3 -m pip install --no-deps --force-reinstall /tmp/ur_whl/fmha-*.whl > /dev/null
  (cd /tmp && FMHA_REQUIRE_GPU=1 python3 -m pytest "$REPO/tests/test_sm90.py" "$REPO/tests/test_forward.py" \
     "$REPO/tests/test_varlen.py" -q -x -k cuda -p no:cacheprovider) 2>&1 | tail -5 | tee "$OUT/tests.txt"
fi
