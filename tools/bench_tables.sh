#!/usr/bin/env bash
# The committed benchmark tables (benchmarks/results/README.md's commands) in one device call,
# from the repository root, each workload into its own folder, all of them returned as one
# tarball ($OUT/tables.tgz: the device tool returns at most 8 files a call).
#
#   OUT=$OUT COMMIT=<short sha> bash tools/bench_tables.sh training fp8 paged_prefill decode
#
# COMMIT names the tree in the results (the device's copy has no git history to read it
# from).  The sm_90 wheel is built and installed first unless BUILD=0.  The training table
# adds FlashAttention-4 when it imports (tools/fa4_carry.sh install, with its PYTHONPATH
# exported, in the same command).  Workloads: training, fp8, paged_prefill, decode, memory,
# training_mma (forward + backward with fmha's mma.sync path beside FlashAttention-2 and
# cuDNN).  Each gets TIMEOUT seconds (default 300); $OUT/tables.txt says how each ended.
set -uo pipefail
OUT=${OUT:-bench-tables}
COMMIT=${COMMIT:?set COMMIT to the short sha of the tree}
mkdir -p "$OUT/tables"
log="$OUT/tables.txt"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader > "$log" 2>&1
if [ "${BUILD:-1}" = 1 ]; then
  start=$(date +%s)
  FMHA_CUDA_ARCHS=90 python3 -m pip wheel --no-build-isolation --no-deps . -w /tmp/bench_tables_whl \
    > "$OUT/tables/wheel.log" 2>&1 &&
    python3 -m pip install --no-deps --force-reinstall /tmp/bench_tables_whl/fmha-*.whl > /dev/null 2>&1
  echo "wheel: exit $?, $(( $(date +%s) - start )) s" >> "$log"
fi
fa4=$(python3 -c "import flash_attn.cute" 2>/dev/null && echo ",fa4" || true)
for w in "$@"; do
  case "$w" in
    training) args=(--suites training --modes fwd,fwd_bwd --peers "torch-flash,torch-cudnn$fa4" --budget 0.12) ;;
    training_mma) args=(--suites training --modes fwd_bwd --peers fmha,fmha-mma,torch-flash,torch-cudnn --budget 0.12) ;;
    memory) args=(--suites memory --peers torch-flash,torch-cudnn) ;;
    fp8) args=(--suites fp8 --budget 0.25) ;;
    paged_prefill) args=(--suites paged_prefill --budget 0.3) ;;
    decode) args=(--suites decode --peers fmha,fmha-fp8,torch-flash,torch-cudnn --budget 0.3) ;;
    *) echo "$w: unknown workload" >> "$log"; continue ;;
  esac
  mkdir -p "$OUT/tables/$w"
  start=$(date +%s)
  # From /tmp, so that `import fmha` finds the installed wheel, not the source tree.
  (cd /tmp && FMHA_BENCH_COMMIT=$COMMIT PYTHONUNBUFFERED=1 timeout "${TIMEOUT:-300}" \
    python3 -m fmha.bench "${args[@]}" --out "$OUT/tables/$w") > "$OUT/tables/$w/terminal.txt" 2>&1
  echo "$w: exit $?, $(( $(date +%s) - start )) s: python -m fmha.bench ${args[*]}" >> "$log"
done
tar -czf "$OUT/tables.tgz" -C "$OUT" tables && rm -rf "$OUT/tables"
cat "$log"
