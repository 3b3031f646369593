"""fmha behind torch's flash-attention ops (fmha.integrations.torch_flash): the registry
entry, activation and restore, and the aten kernels' argument mapping.  The mapping is
checked on the CPU by registering the same kernels for the CPU dispatch key (torch has no
CPU kernel for these ops), through the aten ops themselves and through
torch.nn.attention.varlen.varlen_attn; on a GPU, SDPA's flash backend is checked to run
fmha's kernels after activation and torch's after restore."""

import inspect
import itertools

import pytest
import torch

import fmha
from fmha.integrations import torch_flash
from conftest import GRAD_TOL, OUT_TOL, assert_close, randn
from reference import attention_ref, attention_ref_grads

registry = pytest.mark.skipif(not torch_flash.registry_available(),
                              reason="this torch has no flash-attention registry (torch.nn.attention)")
aten = torch.ops.aten


@registry
def test_registered_but_not_active():
    assert "fmha" in torch.nn.attention.list_flash_attention_impls()
    assert torch.nn.attention.current_flash_attention_impl() != "fmha"


@registry
def test_activate_and_restore():
    # Through torch's API, and through the handle fmha.use_as_sdpa_backend() returns.
    torch.nn.attention.activate_flash_attention_impl("fmha")
    assert torch.nn.attention.current_flash_attention_impl() == "fmha"
    torch.nn.attention.restore_flash_attention_impl()
    assert torch.nn.attention.current_flash_attention_impl() is None
    handle = fmha.use_as_sdpa_backend()
    assert torch.nn.attention.current_flash_attention_impl() == "fmha"
    handle.remove()
    assert torch.nn.attention.current_flash_attention_impl() is None


@pytest.fixture
def cpu_kernels():
    handle = torch_flash._register_kernels("CPU")
    yield
    handle.remove()


def _grads_ref(q, k, v, dout, **kw):
    return attention_ref_grads(q, k, v, dout, **kw)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_flash_attention_ops_dense(cpu_kernels, dtype):
    # Bottom-right causal with a left window, GQA 4:2, Sq != Sk, an explicit scale.
    B, sq, sk, hq, hk, d = 2, 70, 90, 4, 2, 32
    q, k, v = randn(B, sq, hq, d, dtype=dtype), randn(B, sk, hk, d, dtype=dtype), randn(B, sk, hk, d, dtype=dtype)
    dout = randn(B, sq, hq, d, dtype=dtype)
    out, lse, rng, unused, dbg = aten._flash_attention_forward(
        q, k, v, None, None, sq, sk, 0.0, True, False, scale=0.3, window_size_left=20, window_size_right=-1)
    ref = dict(causal=True, window_size=(20, -1), softmax_scale=0.3)
    ref_out, ref_lse, dq_ref, dk_ref, dv_ref = _grads_ref(q, k, v, dout, **ref)
    assert_close(out, ref_out, OUT_TOL[dtype], "out")
    assert lse.shape == (B, hq, sq) and lse.dtype == torch.float32
    assert_close(lse, ref_lse, 1e-4, "lse")
    dq, dk, dv = aten._flash_attention_backward(dout, q, k, v, out, lse, None, None, sq, sk, 0.0, True, rng, unused,
                                                scale=0.3, window_size_left=20, window_size_right=-1)
    for name, got, want in (("dq", dq, dq_ref), ("dk", dk, dk_ref), ("dv", dv, dv_ref)):
        assert_close(got, want, GRAD_TOL[dtype], name)


def _varlen_case(device):
    """Packed sequences (one empty) for torch.nn.attention.varlen.varlen_attn, causal, with
    GQA where this torch's varlen_attn has enable_gqa (2.13; 2.11 has is_causal and neither
    window_size nor enable_gqa)."""
    varlen = pytest.importorskip("torch.nn.attention.varlen", reason="this torch has no varlen_attn (2.11+)")
    varlen_attn = varlen.varlen_attn
    params = inspect.signature(varlen_attn).parameters
    kw = dict(window_size=(-1, 0)) if "window_size" in params else dict(is_causal=True)
    hk = 4
    if "enable_gqa" in params:
        kw["enable_gqa"], hk = True, 2
    lens_q, lens_k = [5, 0, 40, 17], [9, 3, 40, 30]
    cu_q = torch.tensor([0] + list(itertools.accumulate(lens_q)), dtype=torch.int32, device=device)
    cu_k = torch.tensor([0] + list(itertools.accumulate(lens_k)), dtype=torch.int32, device=device)
    dtype = torch.bfloat16
    q = randn(int(cu_q[-1]), 4, 64, dtype=dtype, device=device).requires_grad_()
    k = randn(int(cu_k[-1]), hk, 64, dtype=dtype, device=device).requires_grad_()
    v = randn(int(cu_k[-1]), hk, 64, dtype=dtype, device=device).requires_grad_()
    dout = randn(int(cu_q[-1]), 4, 64, dtype=dtype, device=device)

    def run():
        out = varlen_attn(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), **kw)
        out.backward(dout)
        return out

    def check(out):
        ref_out, _, dq, dk, dv = _grads_ref(q.detach().cpu(), k.detach().cpu(), v.detach().cpu(), dout.cpu(),
                                            causal=True, cu_seqlens_q=cu_q.cpu(), cu_seqlens_k=cu_k.cpu())
        assert_close(out, ref_out, OUT_TOL[dtype], "out")
        for name, got, want in (("dq", q.grad, dq), ("dk", k.grad, dk), ("dv", v.grad, dv)):
            assert_close(got, want, GRAD_TOL[dtype], name)

    return run, check


def test_varlen_attn(cpu_kernels):
    # torch's public varlen API on the CPU, forward and backward through its autograd.
    run, check = _varlen_case("cpu")
    check(run())


def test_varlen_attn_runs_fmha(device):
    # On a GPU: varlen_attn after activation runs fmha's kernels (seen by the profiler) and
    # matches the float64 reference, forward and backward.
    if device == "cpu":
        pytest.skip("varlen_attn reaches the flash ops on CUDA tensors only (test_varlen_attn covers the CPU)")
    run, check = _varlen_case(device)
    handle = fmha.use_as_sdpa_backend()
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            out = run()
            torch.cuda.synchronize()
    finally:
        handle.remove()
    names = {e.name for e in prof.events()}
    assert any("fmha" in n for n in names), f"varlen_attn did not run fmha's kernels: {sorted(names)}"
    check(out)


def test_sdpa_flash_ops(cpu_kernels):
    # SDPA's (B, H, S, D) layout, and its top-left causal mask (Sq < Sk here).
    dtype = torch.float16
    B, hq, sq, sk, d = 2, 4, 40, 60, 64
    q, k, v = randn(B, hq, sq, d, dtype=dtype), randn(B, hq, sk, d, dtype=dtype), randn(B, hq, sk, d, dtype=dtype)
    dout = randn(B, hq, sq, d, dtype=dtype)
    res = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True, False)
    out, lse, seed, offset = res[0], res[1], res[6], res[7]
    assert out.shape == (B, hq, sq, d) and (res[4], res[5]) == (sq, sk)
    t = lambda x: x.transpose(1, 2)  # noqa: E731
    ref_out, ref_lse, dq_ref, dk_ref, dv_ref = _grads_ref(t(q), t(k), t(v), t(dout), causal=True, top_left=True)
    assert_close(t(out), ref_out, OUT_TOL[dtype], "out")
    assert_close(lse, ref_lse, 1e-4, "lse")
    dq, dk, dv = aten._scaled_dot_product_flash_attention_backward(dout, q, k, v, out, lse, None, None, sq, sk, 0.0,
                                                                   True, seed, offset)
    for name, got, want in (("dq", dq, dq_ref), ("dk", dk, dk_ref), ("dv", dv, dv_ref)):
        assert got.shape == (B, hq, sq if name == "dq" else sk, d)
        assert_close(t(got), want, GRAD_TOL[dtype], name)


def test_dropout_rng_state_round_trip(cpu_kernels):
    # The rng state the forward returns is what the backward replays: the same results as
    # fmha's own op given that (seed, offset).
    dtype = torch.float32
    q, k, v, dout = (randn(1, 50, 2, 16, dtype=dtype) for _ in range(4))
    out, lse, rng, unused, _ = aten._flash_attention_forward(q, k, v, None, None, 50, 50, 0.25, False, False)
    state = rng.view(torch.int64).cpu()
    assert rng.dtype == torch.uint64 and state.abs().sum() > 0
    want_out, want_lse, _, _ = torch.ops.fmha.fwd(q, k, v, None, None, None, 50, 50, 16 ** -0.5, 0.0, -1, -1, False,
                                                   None, 0.25, False, False, state)
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)
    dq, dk, dv = aten._flash_attention_backward(dout, q, k, v, out, lse, None, None, 50, 50, 0.25, False, rng, unused)
    want = torch.ops.fmha.bwd(dout, q, k, v, out, lse, None, None, None, None, 50, 50, 16 ** -0.5, 0.0, -1, -1,
                              False, None, 0.25, state, False)
    for got, w in zip((dq, dk, dv), want):
        assert torch.equal(got, w)


def test_unsupported_calls_raise(cpu_kernels):
    q = randn(1, 8, 2, 16, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="block_table"):
        aten._flash_attention_forward(q, q, q, None, None, 8, 8, 0.0, False, False,
                                      block_table=torch.zeros(1, 1, dtype=torch.int32))
    with pytest.raises(RuntimeError, match="alibi_slopes"):
        aten._flash_attention_forward(q, q, q, None, None, 8, 8, 0.0, False, False, alibi_slopes=torch.ones(2))
    with pytest.raises(RuntimeError, match="return_debug_mask"):
        aten._flash_attention_forward(q, q, q, None, None, 8, 8, 0.0, False, True)


def test_sdpa_flash_backend_runs_fmha(device):
    # On a GPU: SDPA's flash backend, then the same call after activation (fmha's kernels,
    # seen by the profiler, outputs and gradients close to torch's), then after restore.
    if device == "cpu":
        pytest.skip("SDPA reaches the flash ops on CUDA tensors only")
    from torch.nn.attention import SDPBackend, sdpa_kernel
    dtype = torch.bfloat16
    q, k, v = (randn(2, 8, 300, 64, dtype=dtype, device=device).requires_grad_() for _ in range(3))
    dout = randn(2, 8, 300, 64, dtype=dtype, device=device)

    def run():
        for t in (q, k, v):
            t.grad = None
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            out.backward(dout)
            torch.cuda.synchronize()
        names = {e.name for e in prof.events()}
        return out.detach(), [t.grad.clone() for t in (q, k, v)], any("fmha" in n for n in names)

    want, want_grads, ran = run()
    assert not ran
    handle = fmha.use_as_sdpa_backend()
    try:
        got, grads, ran = run()
    finally:
        handle.remove()
    assert ran, "SDPA's flash backend did not run fmha's kernels after activation"
    assert_close(got, want, OUT_TOL[dtype], "out")
    for name, g, w in zip(("dq", "dk", "dv"), grads, want_grads):
        assert_close(g, w, GRAD_TOL[dtype], name)
    _, _, ran = run()
    assert not ran, "torch's flash kernels did not come back after restore"
