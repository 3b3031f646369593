#!/usr/bin/env bash
# CI for the AMD kernels without an AMD GPU: compiles fmha's HIP kernels for gfx942 and
# gfx90a with clang-19 and executes the code objects on the project's own wave64 CDNA
# emulator (tools/amdemu): the emulator's instruction tests against the MFMA calculator
# tables, then forward, backward (atomic and deterministic dQ) and decode at small shapes
# against a float64 reference, under several wave orders with the LDS race and s_waitcnt
# checks on, broken kernel variants that must be caught, and the same problems on the CPU
# backend's libfmha (tests/amd).
# FMHA_TEST_FULL=1 runs the full set.  Needs Python with numpy and pytest (installed into
# the active environment if missing) and Debian's clang-19, lld-19, llvm-19 and HIP headers.
set -euo pipefail
cd "$(dirname "$0")/.."

start=$(date +%s)
need=()
command -v clang++-19 >/dev/null || need+=(clang-19)
command -v ld.lld-19 >/dev/null || need+=(lld-19)
command -v llvm-objdump-19 >/dev/null || need+=(llvm-19)
[ -f /usr/include/hip/hip_runtime.h ] || need+=(libamdhip64-dev)
if [ ${#need[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
python -c "import numpy, pytest" 2>/dev/null || python -m pip install --quiet numpy pytest
# The CPU backend's libfmha, the second reference (tests/amd/test_emu_kernels.py): .ci/run's
# build-ctest/ if there, else a CPU-only build of the library alone.
if [ -z "${FMHA_LIBFMHA:-}" ] && [ ! -f build-ctest/libfmha.so ]; then
  { command -v cmake && command -v ninja; } >/dev/null || python -m pip install --quiet cmake ninja
  cmake -S . -B build-amdemu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFMHA_ENABLE_CUDA=OFF -DFMHA_ENABLE_HIP=OFF >/dev/null
  cmake --build build-amdemu --target fmha >/dev/null
fi
echo "AMD emulator toolchain ready: $(( $(date +%s) - start )) s"

t0=$(date +%s)
# --noconftest: these tests need neither torch nor the fmha build (tests/conftest.py imports both).
python -m pytest --noconftest -q tests/amd
echo "AMD emulator suite: $(( $(date +%s) - t0 )) s; whole script: $(( $(date +%s) - start )) s"
