#!/usr/bin/env bash
# The commands of Dockerfile.cuda's build stage, in one script that CI (.ci/run) runs too,
# outside Docker:
#   1. the release wheel (tools/release_wheel.sh: pip wheel, auditwheel repair and show,
#      the size check) into dist/;
#   2. for each torch requirement in FMHA_TEST_TORCH, docker/test_wheel.sh: a fresh virtual
#      environment with that torch and the wheel, the test suite there (on the CPU, as no
#      GPU is seen at build time), and the C++ find_package(fmha) consumer against it.
#
# Needs: $PYTHON (default python3) with venv, pip and its C headers; a C++ compiler; nvcc
# (the wheel must have CUDA kernels); cmake >= 3.24 and ninja on PATH.
# Environment: FMHA_CUDA_ARCHS (default: pyproject.toml's, all five), FMHA_TEST_TORCH
# (torch requirements, one environment each; default "torch"), FMHA_TORCH_INDEX_URL,
# FMHA_TEST_ARGS (see docker/test_wheel.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
export FMHA_EXPECT_BACKEND=${FMHA_EXPECT_BACKEND-cuda}

start=$(date +%s)
PYTHON="$py" tools/release_wheel.sh dist
tag=$("$py" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
wheel=$(ls -t dist/fmha-*-"$tag"-"$tag"-manylinux*.whl | head -1)
echo "build_cuda: release wheel: $(( $(date +%s) - start )) s"

read -r -a torches <<< "${FMHA_TEST_TORCH:-torch}"
i=0
for torch_req in "${torches[@]}"; do
  i=$(( i + 1 ))
  PYTHON="$py" docker/test_wheel.sh "$wheel" "build/wheel-test/$i" "$torch_req"
done
echo "build_cuda: $(( $(date +%s) - start )) s"
