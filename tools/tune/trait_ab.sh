#!/bin/bash
# Device A/B of one compile-time choice in the sm_90a kernels, in one call, from the repository
# root: the base tree is this one with a sed expression applied to one header, both trees
# build a harness per head dim, and two alternating rounds time them (kernels alone).  The
# harnesses print a checksum of the outputs' bits (-DTUNE_CHECKSUM), which must match
# between base and new where the choice does not change the arithmetic.
#   OUT=$OUT bash tools/tune/trait_ab.sh NAME HARNESS "DIMS" HEADER 'SED' [FLAGS]
#   NAME     the output's name: $OUT/NAME_ab.txt
#   HARNESS  tools/tune/tune_sm90.cu (the forward; add -DTUNE_DISPATCHED to FLAGS for the
#            tiles the library dispatches) or tools/tune/tune_sm90_bwd.cu (the backward)
#   DIMS     head dims, one build each (-DTUNE_D)
#   HEADER   the file under csrc/ that SED turns into the base (checked: it must change it)
# BASE_TAR=<tar of csrc/ and tools/> takes the base from that tar instead (HEADER and SED
# then '-'), for a change wider than one switch, e.g. the last commit's tree:
#   git archive HEAD csrc tools > .dev/base.tar
# and the base then builds its own copy of HARNESS where the tar holds one.
# $OUT/NAME_summary.txt then holds tools/tune/ab_summary.py's reading of the rounds (base / new
# per shape and per head dim and mask, checksums equal or not); lines of code the change
# leaves alone are the run's control.
# TESTS=1 also builds the sm_90 wheel and runs the GPU tests of FILES (paths from the root,
# default tests/test_sm90.py) on it, into $OUT/tests.txt; SAN=<kernel name part> then runs
# memcheck, racecheck and synccheck on the kernels so named over tools/sanitize_cases.py,
# into $OUT/sanitizers.txt.  The backward's runs (kMaskRuns) against one
# loop, for example:
#   OUT=$OUT TESTS=1 SAN=bwd_sm90 bash tools/tune/trait_ab.sh bwd_mask_runs tools/tune/tune_sm90_bwd.cu "64 128 192" \
#     cuda_fmha/bwd_sm90_kernel.h 's/static constexpr bool kMaskRuns = .*;/static constexpr bool kMaskRuns = false;/'
set -euo pipefail
NAME=$1 HARNESS=$2 DIMS=$3 HEADER=$4 SED=$5 FLAGS=${6:-}
OUT=${OUT:-/tmp/trait_ab_out}
mkdir -p "$OUT"
REPO=$PWD BASE=/tmp/trait_ab_base
rm -rf "$BASE" && mkdir -p "$BASE"
if [ -n "${BASE_TAR:-}" ]; then
  tar -xf "$BASE_TAR" -C "$BASE"
else
  cp -r csrc "$BASE/"
  sed -i "$SED" "$BASE/csrc/$HEADER"
  if cmp -s "csrc/$HEADER" "$BASE/csrc/$HEADER"; then echo "the sed expression left csrc/$HEADER unchanged" >&2; exit 1; fi
fi
for D in $DIMS; do
  for t in base new; do
    tree=$([ $t = base ] && echo "$BASE" || echo "$REPO")
    harness=$([ -f "$tree/$HARNESS" ] && echo "$tree/$HARNESS" || echo "$REPO/$HARNESS")
    # The fp8 forward's V^T pass lives in fwd_fp8.cu (tune_sm90.cu -DTUNE_FP8).
    extra=$([[ "$FLAGS" == *TUNE_FP8* ]] && echo "$tree/csrc/cuda_fmha/fwd_fp8.cu" || true)
    # shellcheck disable=SC2086
    nvcc -std=c++17 -O3 --use_fast_math -gencode arch=compute_90a,code=sm_90a -DTUNE_D="$D" -DTUNE_CHECKSUM $FLAGS \
      -I"$tree/csrc" -I"$tree/csrc/include" "$harness" "$tree/csrc/cuda_fmha/tma.cu" $extra -o "/tmp/trait_ab_${t}_$D" &
  done
done
wait
for r in 1 2; do
  for D in $DIMS; do
    # base first in round 1, new first in round 2: a drift between the first and the second
    # run of a pair (measured up to 6% on unchanged kernels) then falls on both trees.
    for t in $([ $r = 1 ] && echo "base new" || echo "new base"); do echo "== round $r D=$D $t"; "/tmp/trait_ab_${t}_$D"; done
  done
done 2>&1 | tee "$OUT/${NAME}_ab.txt"
python3 "$REPO/tools/tune/ab_summary.py" "$OUT/${NAME}_ab.txt" > "$OUT/${NAME}_summary.txt" || true
if [ "${TESTS:-0}" = 1 ]; then
  FMHA_CUDA_ARCHS=90 python3 -m pip wheel --no-build-isolation --no-deps . -w /tmp/trait_ab_whl > "$OUT/wheel.log" 2>&1
  python3 -m pip install --no-deps --force-reinstall /tmp/trait_ab_whl/fmha-*.whl > /dev/null
  files=()
  for f in ${FILES:-tests/test_sm90.py}; do files+=("$REPO/$f"); done
  (cd /tmp && FMHA_REQUIRE_GPU=1 python3 -m pytest "${files[@]}" -q -x -k cuda -p no:cacheprovider) 2>&1 |
    tail -5 | tee "$OUT/tests.txt" || true
  if [ -n "${SAN:-}" ]; then
    for tool in memcheck racecheck synccheck; do
      echo "== $tool (kernels matching $SAN)"
      (cd /tmp && compute-sanitizer --tool "$tool" --kernel-name "kns=$SAN" python3 "$REPO/tools/sanitize_cases.py") 2>&1 |
        tail -4
    done | tee "$OUT/sanitizers.txt"
  fi
fi
