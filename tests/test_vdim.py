"""A V head dim that differs from the QK head dim (issue 22, item 5): (192, 128) as
DeepSeek's MLA prefill uses it, the reverse, and odd pairs, on flash_attn_func and
flash_attn_varlen_func, forward and backward, against float64 autograd of the reference
(tests/reference.py, whose P.V takes v's own head dim and whose scale is the QK head dim's).
NaN-filled output buffers; GQA; varlen with empty sequences; out=; sinks together with it;
the errors.  CPU always, CUDA where present (conftest's `device`); the "16-byte-rows" case of
test_serving's `rows` fixture runs the CPU backend behind the GPU kernels' layout rules, so
the rounding of the padded width to a multiple of 8 is checked here too."""

import math

import pytest
import torch

import fmha
from conftest import (assert_close, check_backward, check_forward, dtype_id, flash_call, leaf,
                      randn, varlen_call)
from test_serving import rows  # noqa: F401  (fixture)

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# (QK head dim, V head dim)
DIMS = [(192, 128), (64, 128), (128, 64), (59, 111)]
DIM_IDS = [f"qk{a}-v{b}" for a, b in DIMS]


def inputs(B, sq, sk, hq, hk, d, dv, dtype):
    return randn(B, sq, hq, d, dtype=dtype), randn(B, sk, hk, d, dtype=dtype), randn(B, sk, hk, dv, dtype=dtype)


@pytest.mark.parametrize("d,dv", DIMS, ids=DIM_IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_fixed(device, rows, dtype, d, dv):  # noqa: F811
    # GQA, causal with more queries than keys (the first rows see nothing: out and dq 0).
    q, k, v = inputs(2, 29, 23, 4, 2, d, dv, dtype)
    opts = dict(causal=True)
    res = check_forward(device, q, k, v, flash_call(**opts), opts)
    assert res["out"].shape == (2, 29, 4, dv)
    assert (res["out"][:, :6] == 0).all()
    check_backward(device, q, k, v, flash_call(**opts), opts, dout=randn(2, 29, 4, dv, dtype=dtype))


@pytest.mark.parametrize("d,dv", [(192, 128), (59, 111)], ids=["qk192-v128", "qk59-v111"])
def test_window_softcap_alibi(device, d, dv):
    dtype = torch.bfloat16
    q, k, v = inputs(2, 40, 40, 4, 1, d, dv, dtype)
    opts = dict(causal=True, window_size=(11, 0), softcap=6.0, alibi_slopes=torch.rand(4) * 0.2)
    check_backward(device, q, k, v, flash_call(**opts), opts, dout=randn(2, 40, 4, dv, dtype=dtype))


@pytest.mark.parametrize("d,dv", [(192, 128), (64, 128), (59, 111)], ids=["qk192-v128", "qk64-v128", "qk59-v111"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_varlen_empty_sequences(device, rows, dtype, d, dv):  # noqa: F811
    # A sequence with no queries, one with no keys, one limited by seqused_k to 0 keys,
    # rows outside every sequence; GQA.
    cu_q = torch.tensor([1, 8, 8, 15, 27, 33], dtype=torch.int32)
    cu_k = torch.tensor([0, 20, 31, 31, 50, 70], dtype=torch.int32)
    used = torch.tensor([20, 5, 0, 0, 17], dtype=torch.int32)
    total_q, total_k = 35, 70
    q = randn(total_q, 4, d, dtype=dtype)
    k, v = randn(total_k, 2, d, dtype=dtype), randn(total_k, 2, dv, dtype=dtype)
    call = varlen_call(cu_q, cu_k, 12, 20, causal=True, seqused_k=used)
    ref = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, seqused_k=used, causal=True)
    res = check_forward(device, q, k, v, call, ref)
    assert res["out"].shape == (total_q, 4, dv)
    check_backward(device, q, k, v, call, ref, dout=randn(total_q, 4, dv, dtype=dtype))


def test_strided_views_of_one_buffer(device, rows):  # noqa: F811
    # MLA-style: k and v as views of one (total, H, D + Dv) projection, q a view too.
    dtype = torch.float16
    d, dv = 192, 128
    cu = torch.tensor([0, 13, 40], dtype=torch.int32)
    kv = randn(40, 2, d + dv, dtype=dtype)
    q = randn(40, 4, d + 8, dtype=dtype)[..., 4:4 + d]

    def call(q, k, v):
        buf = torch.cat((k, v), dim=-1)  # differentiable: gradients reach k and v through the views
        out, lse, _ = fmha.flash_attn_varlen_func(q, buf[..., :d], buf[..., d:], cu.to(q.device), cu.to(q.device),
                                                  27, 27, causal=True, return_attn_probs=True)
        return out, lse

    ref = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, causal=True)
    k, v = kv[..., :d], kv[..., d:]
    check_forward(device, q, k, v, call, ref)
    check_backward(device, q, k, v, call, ref, dout=randn(40, 4, dv, dtype=dtype))


@pytest.mark.parametrize("d,dv", [(192, 128), (64, 128)], ids=["qk192-v128", "qk64-v128"])
def test_out(device, rows, d, dv):  # noqa: F811
    # out= has v's head dim; written in place (inference) and through autograd.
    dtype = torch.bfloat16
    q, k, v = (t.to(device) for t in inputs(2, 31, 31, 4, 2, d, dv, dtype))
    want = fmha.flash_attn_func(q, k, v, causal=True)
    buf = torch.full((2, 31, 4, dv + 6), math.nan, dtype=dtype, device=device)
    out = buf[..., 3:3 + dv]
    res = fmha.flash_attn_func(q, k, v, causal=True, out=out)
    assert res is out and torch.equal(out, want)
    assert torch.isnan(buf[..., :3]).all() and torch.isnan(buf[..., 3 + dv:]).all()
    ql = leaf(q)
    out = torch.full((2, 31, 4, dv), math.nan, dtype=dtype, device=device)
    res = fmha.flash_attn_func(ql, k, v, causal=True, out=out)
    assert res is out and out.requires_grad and torch.equal(out.detach(), want)
    out.float().sum().backward()
    assert ql.grad.shape == q.shape and torch.isfinite(ql.grad).all()
    with pytest.raises(ValueError, match=rf"out must have shape \(2, 31, 4, {dv}\)"):
        fmha.flash_attn_func(q, k, v, out=torch.empty(2, 31, 4, d, dtype=dtype, device=device))


def test_with_sinks(device):
    # Both features together, through the varlen function: out, lse and every gradient
    # (d s_aux included) against the reference.
    from test_sinks import check, sinks
    from test_sinks import varlen_call as sink_varlen_call
    dtype = torch.bfloat16
    cu_q = torch.tensor([0, 9, 9, 30], dtype=torch.int32)
    cu_k = torch.tensor([0, 25, 40, 52], dtype=torch.int32)
    q = randn(30, 4, 192, dtype=dtype)
    k, v = randn(52, 2, 192, dtype=dtype), randn(52, 2, 128, dtype=dtype)
    res, _ = check(device, sink_varlen_call(cu_q, cu_k, 21, 25, causal=True), q, k, v, sinks(4),
                   dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=True), (4, 30))
    assert res["out"].shape == (30, 4, 128) and res["dv"].shape == v.shape and res["dq"].shape == q.shape


def test_compile_fullgraph(device):
    q, k, v = (t.to(device) for t in inputs(2, 20, 20, 4, 2, 64, 32, torch.float32))

    def step(q, k, v):
        return fmha.flash_attn_func(q, k, v, causal=True)

    eager_leaves, compiled_leaves = [leaf(t) for t in (q, k, v)], [leaf(t) for t in (q, k, v)]
    eager = step(*eager_leaves)
    eager.sum().backward()
    compiled = torch.compile(step, fullgraph=True)(*compiled_leaves)
    compiled.sum().backward()
    assert compiled.shape == (2, 20, 4, 32)
    assert_close(compiled.detach(), eager.detach(), 1e-6, "compiled out")
    for a, b, name in zip(compiled_leaves, eager_leaves, ("dq", "dk", "dv")):
        assert_close(a.grad, b.grad, 1e-6, f"compiled {name}")


def test_scale_is_the_qk_head_dims(device):
    # The default scale is the QK head dim's, not the padded width's: with D = 64 < Dv = 128
    # the call equals an explicit 64 ** -0.5, and differs from 128 ** -0.5.
    q, k, v = (t.to(device) for t in inputs(1, 16, 16, 2, 2, 64, 128, torch.float32))
    got = fmha.flash_attn_func(q, k, v)
    assert torch.equal(got, fmha.flash_attn_func(q, k, v, softmax_scale=64 ** -0.5))
    assert not torch.allclose(got, fmha.flash_attn_func(q, k, v, softmax_scale=128 ** -0.5))


# ---------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------


def test_errors(device):
    q = randn(2, 8, 4, 64, dtype=torch.float16, device=device)
    k = randn(2, 8, 2, 64, dtype=torch.float16, device=device)
    v = randn(2, 8, 2, 32, dtype=torch.float16, device=device)
    with pytest.raises(ValueError, match=r"v must have the shape of k \(2, 8, 2, 64\) except the head dim"):
        fmha.flash_attn_func(q, k, randn(2, 8, 1, 32, dtype=torch.float16, device=device))
    with pytest.raises(ValueError, match=r"v must have the shape of k \(2, 8, 2, 64\) except the head dim"):
        fmha.flash_attn_func(q, k, randn(2, 9, 2, 32, dtype=torch.float16, device=device))
    with pytest.raises(ValueError, match="k has head dimension 48 but q has 64"):
        fmha.flash_attn_func(q, k[..., :48], v)
    with pytest.raises(ValueError, match="v's head dimension .* between 1 and 256, got 257"):
        fmha.flash_attn_func(q, k, randn(2, 8, 2, 257, dtype=torch.float16, device=device))
    with pytest.raises(ValueError, match="head dimension .* between 1 and 256, got 300"):
        fmha.flash_attn_func(*(randn(2, 8, 2, 300, dtype=torch.float16, device=device) for _ in range(2)), v)
    with pytest.raises(TypeError, match="q, k and v must share a dtype"):
        fmha.flash_attn_func(q, k, v.float())
    cu = torch.tensor([0, 16], dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match=r"v must have the shape of k \(16, 2, 64\) except the head dim"):
        fmha.flash_attn_varlen_func(q.reshape(16, 4, 64), k.reshape(16, 2, 64), v.reshape(8, 4, 32), cu, cu, 16, 16)


def test_kvcache_needs_one_head_dim(device):
    q = randn(2, 1, 4, 64, dtype=torch.float16, device=device)
    kc = randn(2, 32, 2, 64, dtype=torch.float16, device=device)
    vc = randn(2, 32, 2, 32, dtype=torch.float16, device=device)
    with pytest.raises(ValueError, match="v_cache has head dimension 32 but k_cache has 64.*flash_attn_varlen_func"):
        fmha.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=torch.tensor([3, 4], dtype=torch.int32, device=device))

