"""The sm_90a forward (wgmma, TMA) on Hopper GPUs (test names carry "cuda" so that the
GPU half, `-k cuda`, selects them): which calls it takes, and that forcing the
mma.sync kernels (FMHA_FORCE_MMA_SYNC=1) gives the same answer.  Every other GPU test runs on
whichever path the dispatch picks, so on an H200 the suite checks the sm_90a kernel; run it
once more with FMHA_FORCE_MMA_SYNC=1 to check the mma.sync kernels there (tools/gpu_check.sh
does both)."""

import os

import pytest
import torch

import fmha
from fmha import _C
from conftest import OUT_TOL, assert_close
from reference import attention_ref


def _hopper_build():
    """An sm_90 GPU, and CUDA kernels compiled for it (FMHA_CUDA_ARCHS with 90: sm_90a)."""
    if torch.version.hip or not torch.cuda.is_available() or torch.cuda.get_device_capability(0) != (9, 0):
        return False
    caps = _C.capabilities(_C.Device.cuda)
    return caps["available"] and bool({"90", "90a"} & set(caps["archs"].split(",")))


pytestmark = pytest.mark.skipif(not _hopper_build(), reason="needs an sm_90 GPU and a build with sm_90a kernels")


def _kernels(fn, force_mma_sync=False):
    """Output of fn() and the names of the fmha CUDA kernels it launched, with
    FMHA_FORCE_MMA_SYNC set as asked (whatever the suite runs under)."""
    old = os.environ.get("FMHA_FORCE_MMA_SYNC")
    os.environ["FMHA_FORCE_MMA_SYNC"] = "1" if force_mma_sync else "0"
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            out = fn()
            torch.cuda.synchronize()
    finally:
        if old is None:
            del os.environ["FMHA_FORCE_MMA_SYNC"]
        else:
            os.environ["FMHA_FORCE_MMA_SYNC"] = old
    return out, {e.name for e in prof.events() if "fmha" in e.name}


def _ran_sm90(names):
    return any("fwd_sm90_kernel" in n for n in names)


@pytest.mark.parametrize("d", [40, 64, 96, 128, 192, 256])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_cuda_sm90_and_mma_sync_paths_agree(d, dtype):
    q = torch.randn(2, 333, 8, d, device="cuda", dtype=dtype)
    k = torch.randn(2, 517, 2, d, device="cuda", dtype=dtype)
    v = torch.randn(2, 517, 2, d, device="cuda", dtype=dtype)

    def call():
        return fmha.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)[:2]

    (out, lse), names = _kernels(call)
    assert _ran_sm90(names), f"the sm_90a forward did not run: {sorted(names)}"
    (out_mma, lse_mma), names_mma = _kernels(call, force_mma_sync=True)
    assert not _ran_sm90(names_mma), f"FMHA_FORCE_MMA_SYNC=1 still ran the sm_90a forward: {sorted(names_mma)}"
    ref_out, ref_lse = attention_ref(q.cpu(), k.cpu(), v.cpu(), causal=True)
    assert_close(out, ref_out, OUT_TOL[dtype], "out (sm_90a)")
    assert_close(out_mma, ref_out, OUT_TOL[dtype], "out (mma.sync)")
    assert_close(lse, lse_mma, 1e-4, "lse (sm_90a vs mma.sync)")


@pytest.mark.parametrize("case", ["dropout", "seqused_k", "head_dim_32", "fp32"])
def test_cuda_calls_the_sm90_forward_does_not_take(case):
    # Dropout, seqused_k, head dims up to 32 and fp32 run on the other kernels, with the same
    # meaning (their results are checked by the rest of the suite).
    dtype = torch.float32 if case == "fp32" else torch.bfloat16
    d = 32 if case == "head_dim_32" else 64
    q, k, v = (torch.randn(1, 100, 2, d, device="cuda", dtype=dtype) for _ in range(3))
    if case == "seqused_k":
        cu = torch.tensor([0, 100], dtype=torch.int32, device="cuda")
        used = torch.tensor([60], dtype=torch.int32, device="cuda")
        fn = lambda: fmha.flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, 100, 100, seqused_k=used)  # noqa: E731
    else:
        fn = lambda: fmha.flash_attn_func(q, k, v, dropout_p=0.1 if case == "dropout" else 0.0)  # noqa: E731
    _, names = _kernels(fn)
    assert names and not _ran_sm90(names), sorted(names)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_cuda_sm90_long_key_blocks(causal):
    # D = 128 takes 176-key blocks where a tile sees at least 8192 keys (half of seqlen_k
    # under a mask; FwdSm90Tile<128>::kNLong): a last block of 8300 % 176 = 28 live keys.
    sk = 16600 if causal else 8300
    q = torch.randn(1, 300, 4, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, sk, 2, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(1, sk, 2, 128, device="cuda", dtype=torch.bfloat16)
    (out, lse), names = _kernels(lambda: fmha.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)[:2])
    assert any("fwd_sm90_kernel" in n and "176" in n for n in names), sorted(names)
    ref_out, ref_lse = attention_ref(q.cpu(), k.cpu(), v.cpu(), causal=causal)
    assert_close(out, ref_out, OUT_TOL[torch.bfloat16], "out")
    assert_close(lse, ref_lse, 1e-4, "lse")
