#!/usr/bin/env bash
# Tests a built fmha wheel as a user gets it: a fresh virtual environment with a torch and
# the wheel, the Python test suite there (GPU cases run where a usable GPU is, and skip
# themselves elsewhere), then the C++ consumer (examples/cpp_consumer) built and run
# against the installed package through find_package(fmha).  Used by docker/build_cuda.sh
# and docker/build_rocm.sh, so by both images' build stages and by CI.
#
#   docker/test_wheel.sh WHEEL DIR TORCH
#
# TORCH: a pip requirement ("torch==2.4.1"), or "system" for the torch of $PYTHON's own
# environment (a --system-site-packages environment: the ROCm build of torch that AMD's
# images carry); more requirements for that environment may follow, comma-separated
# ("torch==2.4.1,transformers<5": transformers 5 needs torch 2.6).  DIR: where the environment and the consumer's build go (recreated).
# Environment: PYTHON (default python3), FMHA_TORCH_INDEX_URL (an extra index for torch),
# FMHA_TEST_ARGS (pytest's arguments, default: tests), FMHA_EXPECT_BACKEND (a backend the
# wheel must have besides cpu: cuda, hip, or empty for none).
set -euo pipefail
cd "$(dirname "$0")/.."
wheel=$1 dir=$2
IFS=, read -r -a reqs <<< "$3"
torch_req=${reqs[0]}
py=${PYTHON:-python3}
read -r -a test_args <<< "${FMHA_TEST_ARGS:-tests}"
index_args=()
[ -n "${FMHA_TORCH_INDEX_URL:-}" ] && index_args=(--extra-index-url "$FMHA_TORCH_INDEX_URL")

t0=$(date +%s)
rm -rf "$dir"
if [ "$torch_req" = system ]; then
  "$py" -m venv --system-site-packages "$dir/venv"
  reqs=("${reqs[@]:1}")
else
  "$py" -m venv "$dir/venv"
fi
[ "${#reqs[@]}" -eq 0 ] || "$dir/venv/bin/python" -m pip install --quiet "${index_args[@]}" "${reqs[@]}"
"$dir/venv/bin/python" -m pip install --quiet "${index_args[@]}" "${wheel}[test]" "${reqs[@]}"
# What is tested is the wheel in this environment, not python/ of the checkout.
"$dir/venv/bin/python" - "${FMHA_EXPECT_BACKEND:-}" <<'PY'
import sys, torch, fmha
assert fmha.__file__.startswith(sys.prefix), f"fmha imported from {fmha.__file__}, not from the wheel"
want = sys.argv[1]
assert not want or want in fmha.available_backends(), \
    f"the wheel has {sorted(fmha.available_backends())}, no {want}"
print(f"test_wheel: torch {torch.__version__}, fmha {fmha.__version__} ({fmha.__file__}), "
      f"backends {sorted(fmha.available_backends())}")
PY
t1=$(date +%s)
"$dir/venv/bin/python" -m pytest -q -p no:cacheprovider "${test_args[@]}"
t2=$(date +%s)
prefix=$("$dir/venv/bin/python" -c 'import fmha; print(fmha.cmake_prefix_path)')
cmake -S examples/cpp_consumer -B "$dir/consumer" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$prefix" > /dev/null
cmake --build "$dir/consumer" > /dev/null
"$dir/consumer/cpp_consumer"
echo "test_wheel: $3: environment $(( t1 - t0 )) s, tests $(( t2 - t1 )) s, C++ consumer $(( $(date +%s) - t2 )) s"
