#!/usr/bin/env bash
# The commands of Dockerfile.rocm's build stage, on AMD's PyTorch image (ROCm's compilers,
# torch's ROCm build):
#   1. the wheel, with the HIP kernels for FMHA_HIP_ARCHS (default gfx90a;gfx942), into
#      dist/ (a linux_x86_64 wheel for that image: it needs ROCm's libamdhip64 at run time,
#      so it is not repaired into a manylinux wheel);
#   2. docker/test_wheel.sh with the image's own torch: the test suite in a fresh
#      environment (on the CPU, as no GPU is seen at build time) and the C++
#      find_package(fmha) consumer against the installed package.
#
# CI cannot run it: CI's machine has no ROCm compiler (CMake's check_language(HIP) finds
# none), so the wheel would have no HIP kernels and step 2 fails on purpose.  CI compiles
# the same HIP kernels device-only with clang-19 instead (.ci/hip_check.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}

start=$(date +%s)
rm -rf build/rocm-wheel
mkdir -p dist
"$py" -m pip wheel --no-deps --wheel-dir build/rocm-wheel .
built=(build/rocm-wheel/fmha-*.whl)
wheel=dist/$(basename "${built[0]}")
mv "${built[0]}" "$wheel"
echo "build_rocm: $wheel: $(( $(date +%s) - start )) s"

FMHA_EXPECT_BACKEND=hip PYTHON="$py" docker/test_wheel.sh "$wheel" build/wheel-test/rocm system
echo "build_rocm: $(( $(date +%s) - start )) s"
