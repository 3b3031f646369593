#!/usr/bin/env bash
# CI for the reduced GPU build (CMake FMHA_HEAD_DIMS, FMHA_ENABLE_BACKWARD, FMHA_ENABLE_DROPOUT;
# docs/api.md, "Smaller builds"), without a GPU: libfmha for sm_80 with head dim 64 only, no
# backward and no dropout must compile and link, load with every symbol resolved, hold
# kernels of head dim 64 only and none of the backward or of dropout, and report that build
# through fmha_get_capabilities.  How such a
# build behaves on a GPU: tests/test_build_options.py with FMHA_TEST_HEAD_DIMS (run on an
# H200, benchmarks/results/2026-12-04-h200-reduced-build).
set -euo pipefail
cd "$(dirname "$0")/.."

start=$(date +%s)
mkdir -p build-reduced
cmake -S . -B build-reduced -G Ninja -DCMAKE_BUILD_TYPE=Release -DFMHA_CUDA_ARCHS=80 -DFMHA_HEAD_DIMS=64 \
  -DFMHA_ENABLE_BACKWARD=OFF -DFMHA_ENABLE_DROPOUT=OFF -DFMHA_ENABLE_HIP=OFF -DFMHA_BUILD_TESTS=OFF \
  > build-reduced/reduced.log 2>&1 ||
  { tail -30 build-reduced/reduced.log; exit 1; }
grep -q "backends: cpu;cuda(80); GPU head dims 64, backward OFF, dropout OFF" build-reduced/reduced.log ||
  { grep "fmha:" build-reduced/reduced.log; echo "reduced build: CUDA not configured as asked"; exit 1; }
cmake --build build-reduced >> build-reduced/reduced.log 2>&1 || { tail -30 build-reduced/reduced.log; exit 1; }

python3 - build-reduced/libfmha.so <<'PY'
import ctypes, os, re, subprocess, sys

lib_path = sys.argv[1]
lib = ctypes.CDLL(lib_path, mode=os.RTLD_NOW)  # raises on an unresolved symbol


class Caps(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("available", ctypes.c_int32), ("dtypes", ctypes.c_uint32),
                ("max_head_dim", ctypes.c_int32), ("features", ctypes.c_uint32), ("archs", ctypes.c_char * 128)]


caps = Caps(struct_size=ctypes.sizeof(Caps))
assert lib.fmha_get_capabilities(1, ctypes.byref(caps)) == 0, "fmha_get_capabilities(CUDA) failed"
assert caps.available == 1 and caps.max_head_dim == 64, (caps.available, caps.max_head_dim)
assert caps.features & 1 == 0 and caps.features & (1 << 6) == 0, hex(caps.features)  # no backward, no dropout
assert caps.features & (1 << 8), hex(caps.features)  # decode
names = subprocess.run(["nm", "-C", "--defined-only", lib_path], capture_output=True, text=True, check=True).stdout
dims = set(re.findall(r"_kernel<fmha::cuda::\w+<[^,]+, (?:\(fmha::CacheKind\)\d+, )?(\d+),", names))
kernels = set(re.findall(r"\b(\w+_kernel)<fmha::cuda::\w+<", names))
assert dims == {"64"}, f"kernels of head dims {sorted(dims)} in a head-dim-64 build"
assert not any("bwd" in k for k in kernels), f"backward kernels in a build without it: {sorted(kernels)}"
dropout = re.findall(r"FwdTraits<[^,]+, \d+, \d+, \d+, \d+, true", names)  # FwdTraits' 6th parameter: kDropout
assert not dropout, f"dropout kernels in a build without them: {sorted(set(dropout))}"
print(f"reduced build: loads, head dims {sorted(dims)}, kernels {sorted(kernels)}, max_head_dim {caps.max_head_dim}, "
      f"features {caps.features:#x}")
PY
echo "reduced CUDA build (sm_80, head dim 64, no backward, no dropout): $(( $(date +%s) - start )) s"
