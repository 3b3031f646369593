#!/usr/bin/env bash
# CI for the HIP backend without an AMD GPU: installs Debian's HIP toolchain (clang-19 and
# the HIP headers), checks that the generated instances are current, then compiles every
# HIP kernel device-only for gfx90a and gfx942 and prints tools/hip_report.py's table.
# Fails if any kernel uses scratch, spills VGPRs, calls a function, or has a matrix-core
# main loop without v_mfma.  Touches nothing of the main build: CMake's check_language(HIP)
# finds no HIP compiler in these packages (checked with cmake 3.25 and 4.4).
set -euo pipefail
cd "$(dirname "$0")/.."

start=$(date +%s)
if ! command -v clang-19 >/dev/null || [ ! -f /usr/include/hip/hip_runtime.h ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends clang-19 libamdhip64-dev >/dev/null
fi
echo "HIP toolchain ready: $(( $(date +%s) - start )) s ($(clang-19 --version | head -1))"

python3 tools/gen_instances.py --check

t0=$(date +%s)
python3 tools/hip_report.py --arch gfx90a gfx942 --compiler clang-19 --jobs "$(nproc)"
echo "HIP compile check (gfx90a, gfx942): $(( $(date +%s) - t0 )) s; whole script: $(( $(date +%s) - start )) s"
