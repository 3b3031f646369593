"""Reduced GPU builds (CMake FMHA_HEAD_DIMS, FMHA_ENABLE_BACKWARD and FMHA_ENABLE_DROPOUT,
docs/api.md "Smaller builds"): kernels for some head dims only, none of the backward's, none
with dropout.

* Everywhere: CMake refuses a head-dim list it cannot build (a dim without kernels, none).
* On a GPU: the library reports the build (fmha_capabilities: max_head_dim, the backward's
  feature bits), every head dim up to the largest built one runs (on the next larger built
  kernel) and matches the float64 reference, forward and decode, while larger ones raise an
  error that names the build; without the backward, backward calls raise, and without
  dropout, fp16/bf16 calls with dropout (the fp32 path keeps it).  The suite runs
  against the full build, where every head dim up to 256 must run; set FMHA_TEST_HEAD_DIMS
  (CMake's list, e.g. "64;128") to run it against a reduced one (.ci/reduced_build.sh checks
  such a library's symbols without a GPU).
"""

import os
import shutil
import subprocess
import tempfile

import pytest
import torch

import fmha
from fmha import _C
from conftest import GPU_USABLE, OUT_TOL, assert_close, check_backward, flash_call, randn
from reference import attention_ref

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALL_DIMS = (32, 64, 96, 128, 192, 256)
DECODE_DIMS = (64, 128, 256)
FP8_DIMS = (64, 128, 256)
BUILT = tuple(sorted(int(x) for x in os.environ.get("FMHA_TEST_HEAD_DIMS", "32;64;96;128;192;256").split(";")))
FEATURE_BACKWARD, FEATURE_DROPOUT, FEATURE_DETERMINISTIC, FEATURE_DECODE = 1 << 0, 1 << 6, 1 << 7, 1 << 8


def kernel_dim(d, dims):
    """The kernel a head dim d runs on among dims in this build, or None."""
    return next((k for k in dims if d <= k and k in BUILT), None)


def _configure(head_dims):
    build = tempfile.mkdtemp(prefix="fmha-cfg-")
    try:
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        return subprocess.run(["cmake", "-S", ROOT, "-B", build, *generator, "-DFMHA_ENABLE_CUDA=OFF",
                               "-DFMHA_ENABLE_HIP=OFF", "-DFMHA_BUILD_TESTS=OFF", f"-DFMHA_HEAD_DIMS={head_dims}"],
                              capture_output=True, text=True)
    finally:
        shutil.rmtree(build, ignore_errors=True)


@pytest.mark.skipif(shutil.which("cmake") is None, reason="needs cmake")
@pytest.mark.parametrize("dims,error", [("64;48", "48 is not a kernel head dim"), ("", "FMHA_HEAD_DIMS is empty")],
                         ids=["unknown", "empty"])
def test_cmake_refuses_head_dims_without_kernels(dims, error):
    r = _configure(dims)
    assert r.returncode != 0 and error in r.stdout + r.stderr, r.stdout[-2000:] + r.stderr[-2000:]


@pytest.mark.skipif(shutil.which("cmake") is None, reason="needs cmake")
def test_cmake_accepts_a_subset():
    r = _configure("128;64")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "GPU head dims 64;128, backward ON" in r.stdout


cuda = pytest.mark.skipif(not GPU_USABLE or bool(torch.version.hip), reason="needs a CUDA GPU and fmha's CUDA kernels")


def _caps():
    return _C.capabilities(_C.Device.cuda)


@cuda
def test_cuda_capabilities_report_the_build():
    caps = _caps()
    assert caps["max_head_dim"] == max(BUILT)
    assert caps["features"] & FEATURE_DECODE
    assert bool(caps["features"] & FEATURE_BACKWARD) == bool(caps["features"] & FEATURE_DETERMINISTIC)


HEAD_DIMS = [24, 40, 64, 72, 100, 128, 160, 200, 256]


@cuda
@pytest.mark.parametrize("d", HEAD_DIMS)
def test_cuda_forward_and_decode_by_head_dim(d):
    q, k, v = (randn(2, 77, 2, d, dtype=torch.bfloat16, device="cuda") for _ in range(3))
    if kernel_dim(d, ALL_DIMS) is None:
        with pytest.raises(RuntimeError, match=f"head_dim {d}: this build"):
            fmha.flash_attn_func(q, k, v, causal=True)
    else:
        out = fmha.flash_attn_func(q, k, v, causal=True)
        ref, _ = attention_ref(q.cpu(), k.cpu(), v.cpu(), causal=True)
        assert_close(out, ref, OUT_TOL[torch.bfloat16], f"out at head dim {d}")
    q1 = q[:, :1]
    lens = torch.tensor([77, 30], dtype=torch.int32, device="cuda")
    if kernel_dim(d, DECODE_DIMS) is None:
        with pytest.raises(RuntimeError, match=f"head_dim {d}: this build"):
            fmha.flash_attn_with_kvcache(q1, k, v, cache_seqlens=lens)
    else:
        out = fmha.flash_attn_with_kvcache(q1, k, v, cache_seqlens=lens)
        for b, n in enumerate((77, 30)):
            ref, _ = attention_ref(q1[b:b + 1].cpu(), k[b:b + 1, :n].cpu(), v[b:b + 1, :n].cpu())
            assert_close(out[b:b + 1], ref, OUT_TOL[torch.bfloat16], f"decode at head dim {d}")


@cuda
@pytest.mark.parametrize("d", [40, 128, 200])
def test_cuda_backward_or_its_refusal(d):
    if kernel_dim(d, ALL_DIMS) is None:
        pytest.skip(f"no forward at head dim {d} in this build")
    q, k, v = (randn(1, 65, 2, d, dtype=torch.bfloat16) for _ in range(3))
    if _caps()["features"] & FEATURE_BACKWARD:
        check_backward("cuda", q, k, v, flash_call(causal=True), dict(causal=True))
        return
    q, k, v = (x.cuda().requires_grad_() for x in (q, k, v))
    out = fmha.flash_attn_func(q, k, v, causal=True)
    with pytest.raises(RuntimeError, match="no backward kernels"):
        out.backward(torch.ones_like(out))


@cuda
def test_cuda_dropout_or_its_refusal():
    q, k, v = (randn(1, 65, 2, 64, dtype=torch.bfloat16, device="cuda") for _ in range(3))
    if _caps()["features"] & FEATURE_DROPOUT:
        out = fmha.flash_attn_func(q, k, v, dropout_p=0.3)
        assert torch.isfinite(out).all() and not torch.equal(out, fmha.flash_attn_func(q, k, v))
    else:
        with pytest.raises(RuntimeError, match="no dropout kernels"):
            fmha.flash_attn_func(q, k, v, dropout_p=0.3)
    ref = fmha.flash_attn_func(q.float(), k.float(), v.float(), dropout_p=0.3)  # the fp32 path keeps dropout
    assert torch.isfinite(ref).all()


def _hopper():
    return GPU_USABLE and not torch.version.hip and torch.cuda.get_device_capability(0) == (9, 0)


@pytest.mark.skipif(not _hopper(), reason="needs an sm_90 (Hopper) GPU")
@pytest.mark.parametrize("d", [48, 64, 100, 128, 200, 256])
def test_cuda_fp8_by_head_dim(d):
    q, k, v = (torch.randn(1, 70, 2, d, device="cuda").to(torch.float8_e4m3fn) for _ in range(3))
    if kernel_dim(d, FP8_DIMS) is None:  # the message names the head dim padded to 16 bytes (200: 208)
        with pytest.raises(RuntimeError, match=r"head_dim \d+: this build's fp8 forward kernels stop at"):
            fmha.flash_attn_func(q, k, v)
        return
    out = fmha.flash_attn_func(q, k, v)
    ref, _ = attention_ref(*(x.float().cpu() for x in (q, k, v)))
    assert torch.isfinite(out).all()
    assert (out.double().cpu() - ref).abs().max().item() <= 0.025 * v.float().abs().max().item() + 1e-3
