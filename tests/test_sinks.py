"""Attention sinks (issue 22, item 3): s_aux / learnable_sink, one logit per query head that
joins every row's softmax denominator and carries no value, on flash_attn_func,
flash_attn_varlen_func, the packed variants and flash_attn_with_kvcache.  Forward (out and
LSE), backward (dq, dk, dv and d s_aux, with a gradient flowing into the LSE too) against
float64 autograd of the reference, which appends the sink logit to every row's scores as an
extra column (tests/reference.py).  NaN-filled output buffers; fully masked rows; empty
sequences; CPU always, CUDA where present (conftest's `device`)."""

import math

import pytest
import torch

import fmha
from conftest import (GRAD_TOL, LSE_TOL, OUT_TOL, assert_close, assert_lse_close, dtype_id, leaf,
                      other_device_available, poison_memory, poisoned_outputs, randn, to_cpu)
from reference import attention_ref

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def sinks(h, dtype=torch.float32):
    """Sink logits of the size the scores have here (|s| ~ a few), some above and some below
    the rows' LSE, so that neither the keys nor the sink dominate every row."""
    return (torch.randn(h) * 1.5 + 1.0).to(dtype)


def ref_grads(q, k, v, s_aux, dout, dlse, **kwargs):
    """out, lse and the gradients of sum(out * dout) + sum(lse * dlse) with respect to q, k,
    v and s_aux, all float64, by autograd through the reference."""
    leaves = [t.detach().double().requires_grad_(True) for t in (q, k, v, s_aux)]
    out, lse = attention_ref(*leaves[:3], s_aux=leaves[3], **kwargs)
    loss = (out * dout.double()).sum() + (lse * dlse.double()).sum()
    grads = torch.autograd.grad(loss, leaves, allow_unused=True)
    grads = [torch.zeros_like(t) if g is None else g for t, g in zip(leaves, grads)]
    return {"out": out.detach(), "lse": lse.detach(), "dq": grads[0], "dk": grads[1], "dv": grads[2],
            "ds": grads[3]}


def run_grads(device, call, q, k, v, s_aux, dout, dlse):
    """call(q, k, v, s_aux) -> (out, lse) on `device` with NaN-filled output buffers, then the
    backward of sum(out * dout) + sum(lse * dlse); everything returned on the CPU."""
    ql, kl, vl, sl = (leaf(t.to(device)) for t in (q, k, v, s_aux))
    with poisoned_outputs():
        out, lse = call(ql, kl, vl, sl)
        torch.autograd.backward([out, lse], [dout.to(device), dlse.to(device)])
    return {"out": to_cpu(out), "lse": to_cpu(lse), "dq": to_cpu(ql.grad), "dk": to_cpu(kl.grad),
            "dv": to_cpu(vl.grad), "ds": to_cpu(sl.grad)}


def compare(res, ref, dtype, what=""):
    assert res["out"].dtype == dtype
    assert_close(res["out"], ref["out"], OUT_TOL[dtype], what + "out")
    assert_lse_close(res["lse"], ref["lse"], LSE_TOL[dtype], what + "lse")
    floor = max(ref[n].norm().item() for n in ("dq", "dk", "dv"))
    for name in ("dq", "dk", "dv", "ds"):
        assert res[name] is not None, f"{what}{name}: no gradient"
        assert_close(res[name], ref[name], GRAD_TOL[dtype], what + name, floor=1e-2 * floor if name != "ds" else 0.0)


def check(device, call, q, k, v, s_aux, ref_kwargs, lse_shape):
    """Forward twice (plain, then after poisoning memory, bitwise equal), then forward and
    backward against the reference; on a GPU also against the CPU backend."""
    dtype = q.dtype
    dout = randn(*q.shape[:-1], v.shape[-1], dtype=dtype)
    dlse = torch.randn(lse_shape)
    with torch.no_grad():
        args = [t.to(device) for t in (q, k, v, s_aux)]
        out, lse = call(*args)
        poison_memory(out, lse)
        with poisoned_outputs():
            out2, lse2 = call(*args)
        assert torch.equal(out, out2) and torch.equal(lse, lse2), "two identical calls differ (or left NaN)"
    res = run_grads(device, call, q, k, v, s_aux, dout, dlse)
    assert torch.equal(res["out"], out.cpu()), "the differentiable call differs from the no-grad one"
    ref = ref_grads(q, k, v, s_aux, dout, dlse, **ref_kwargs)
    compare(res, ref, dtype)
    if device != "cpu":
        cpu = run_grads("cpu", call, q, k, v, s_aux, dout, dlse)
        for name in ("out", "dq", "dk", "dv", "ds"):
            tol = 2 * (OUT_TOL if name == "out" else GRAD_TOL)[dtype]
            assert_close(res[name], cpu[name], tol, f"{name} (GPU vs CPU backend)")
    return res, ref


def fixed_call(**opts):
    def call(q, k, v, s):
        kw = {n: (x.to(q.device) if isinstance(x, torch.Tensor) else x) for n, x in opts.items()}
        out, lse, _ = fmha.flash_attn_func(q, k, v, return_attn_probs=True, s_aux=s, **kw)
        return out, lse
    return call


def varlen_call(cu_q, cu_k, max_q, max_k, **opts):
    def call(q, k, v, s):
        kw = {n: (x.to(q.device) if isinstance(x, torch.Tensor) else x) for n, x in opts.items()}
        return fmha.flash_attn_varlen_func(q, k, v, cu_q.to(q.device), cu_k.to(q.device), max_q, max_k,
                                           return_softmax_lse=True, s_aux=s, **kw)
    return call


# ---------------------------------------------------------------------------------------
# flash_attn_func
# ---------------------------------------------------------------------------------------

# (Sq, Sk, Hq, Hk, D, options): causal with Sq > Sk leaves the first Sq - Sk rows with no key
# (the sink takes all their mass); a window, softcap and ALiBi change the scores the sink
# competes with.
FIXED_CASES = [
    ("causal-gqa", 37, 50, 4, 2, 64, dict(causal=True)),
    ("masked-rows", 40, 23, 4, 1, 32, dict(causal=True)),
    ("full", 19, 33, 2, 2, 40, dict()),
    ("window-softcap", 45, 45, 4, 2, 64, dict(causal=True, window_size=(9, 0), softcap=7.0)),
    ("alibi", 30, 41, 4, 4, 48, dict(causal=True, alibi_slopes=torch.rand(4) * 0.3)),
]


@pytest.mark.parametrize("case", FIXED_CASES, ids=[c[0] for c in FIXED_CASES])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_fixed(device, dtype, case):
    _, sq, sk, hq, hk, d, opts = case
    B = 2
    q, k, v = randn(B, sq, hq, d, dtype=dtype), randn(B, sk, hk, d, dtype=dtype), randn(B, sk, hk, d, dtype=dtype)
    s_aux = sinks(hq)
    res, ref = check(device, fixed_call(**opts), q, k, v, s_aux, opts, (B, hq, sq))
    if sq > sk and opts.get("causal"):
        # Rows with no key: out exactly 0, lse exactly the sink's logit, dq exactly 0.
        empty = sq - sk
        assert (res["out"][:, :empty] == 0).all()
        assert torch.equal(res["lse"][:, :, :empty], s_aux[None, :, None].expand(B, hq, empty))
        assert (res["dq"][:, :empty] == 0).all()


def test_sink_in_the_input_dtype(device):
    # vLLM keeps gpt-oss's sinks in the model dtype (bf16): accepted, computed in fp32, and
    # the gradient comes back in that dtype.  The same logits in fp32 give the same result.
    dtype = torch.bfloat16
    q, k, v = randn(2, 33, 4, 64, dtype=dtype), randn(2, 47, 2, 64, dtype=dtype), randn(2, 47, 2, 64, dtype=dtype)
    s_aux = sinks(4, dtype)
    res, _ = check(device, fixed_call(causal=True), q, k, v, s_aux, dict(causal=True), (2, 4, 33))
    assert res["ds"].dtype == dtype
    args = [t.to(device) for t in (q, k, v)]
    same = fmha.flash_attn_func(*args, causal=True, s_aux=s_aux.float().to(device))
    assert torch.equal(same.cpu(), res["out"])


def test_only_the_sink_requires_grad(device):
    # Frozen q, k, v and a trainable sink: d s_aux is still exact (no autograd node for the
    # kernel itself, only for the sink's correction).
    q, k, v = (randn(2, 21, 4, 32, dtype=torch.float32) for _ in range(3))
    s = leaf(sinks(4).to(device))
    dout = randn(2, 21, 4, 32, dtype=torch.float32)
    out = fmha.flash_attn_func(*(t.to(device) for t in (q, k, v)), causal=True, s_aux=s)
    out.backward(dout.to(device))
    ref = ref_grads(q, k, v, s.detach().cpu(), dout, torch.zeros(2, 4, 21), causal=True)
    assert_close(out.detach().cpu(), ref["out"], OUT_TOL[torch.float32], "out")
    assert_close(s.grad.cpu(), ref["ds"], GRAD_TOL[torch.float32], "ds")


def test_learnable_sink_is_s_aux(device):
    q, k, v = (randn(2, 25, 4, 32, dtype=torch.float16, device=device) for _ in range(3))
    s = sinks(4).to(device)
    a, lse_a, _ = fmha.flash_attn_func(q, k, v, causal=True, s_aux=s, return_attn_probs=True)
    b, lse_b, _ = fmha.flash_attn_func(q, k, v, causal=True, learnable_sink=s, return_attn_probs=True)
    assert torch.equal(a, b) and torch.equal(lse_a, lse_b)
    # A sink far below every row's LSE changes nothing measurable; without one, the
    # result is the plain attention.
    plain = fmha.flash_attn_func(q, k, v, causal=True)
    low = fmha.flash_attn_func(q, k, v, causal=True, s_aux=torch.full((4,), -200.0, device=device))
    assert torch.equal(low, plain)
    assert not torch.equal(a, plain)


def test_out_with_sink(device):
    # out= with a sink, inference: the kernel writes the caller's tensor and the sink's
    # weight is applied there in place; with gradients the result is copied in.
    from test_serving import count_allocations
    dtype = torch.bfloat16
    B, S, H, d = 2, 29, 4, 64
    q, k, v = (randn(B, S, H, d, dtype=dtype, device=device) for _ in range(3))
    s = sinks(H).to(device)
    want = fmha.flash_attn_func(q, k, v, causal=True, s_aux=s)
    out = torch.full((B, S, H, d), math.nan, dtype=dtype, device=device)
    with count_allocations(fmha.ops) as allocs:
        res = fmha.flash_attn_func(q, k, v, causal=True, s_aux=s, out=out)
    assert res is out and torch.equal(out, want)
    assert (B, S, H, d) not in allocs.shapes, f"an output-sized buffer was allocated: {allocs.shapes}"
    ql = leaf(q)
    out = torch.full((B, S, H, d), math.nan, dtype=dtype, device=device)
    res = fmha.flash_attn_func(ql, k, v, causal=True, s_aux=s, out=out)
    assert res is out and out.requires_grad and torch.equal(out.detach(), want)
    out.sum().backward()
    assert ql.grad is not None and torch.isfinite(ql.grad).all()


# ---------------------------------------------------------------------------------------
# flash_attn_varlen_func
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_varlen_empty_sequences(device, dtype):
    # Sequences with no queries, with no keys (every row sees nothing: out 0, lse = s), a
    # causal one with more queries than keys, and rows before cu_seqlens_q[0] and after
    # cu_seqlens_q[-1] that belong to no sequence (out 0, lse = s as well).
    cu_q = torch.tensor([2, 9, 9, 16, 30, 41], dtype=torch.int32)
    cu_k = torch.tensor([0, 15, 40, 40, 52, 80], dtype=torch.int32)
    total_q, total_k, hq, hk, d = 43, 80, 4, 2, 40
    q = randn(total_q, hq, d, dtype=dtype)
    k, v = randn(total_k, hk, d, dtype=dtype), randn(total_k, hk, d, dtype=dtype)
    s_aux = sinks(hq)
    opts = dict(causal=True)
    res, _ = check(device, varlen_call(cu_q, cu_k, 14, 28, **opts), q, k, v, s_aux,
                   dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, **opts), (hq, total_q))
    no_key = torch.zeros(total_q, dtype=torch.bool)
    no_key[:2] = no_key[41:] = True  # outside every sequence
    no_key[9:16] = True  # the sequence with no keys
    no_key[16:18] = True  # 14 queries, 12 keys, causal: the first two see nothing
    assert (res["out"][no_key] == 0).all()
    assert torch.equal(res["lse"][:, no_key], s_aux[:, None].expand(hq, int(no_key.sum())))
    assert (res["dq"][no_key] == 0).all()


def test_varlen_seqused_k_and_window(device):
    dtype = torch.float16
    cu_q = torch.tensor([0, 1, 9, 30], dtype=torch.int32)
    cu_k = torch.tensor([0, 40, 60, 100], dtype=torch.int32)
    used = torch.tensor([33, 0, 37], dtype=torch.int32)
    q = randn(30, 8, 64, dtype=dtype)
    k, v = randn(100, 2, 64, dtype=dtype), randn(100, 2, 64, dtype=dtype)
    opts = dict(causal=True, window_size=(16, 0), softcap=20.0)
    call = varlen_call(cu_q, cu_k, 21, 40, seqused_k=used, **opts)
    check(device, call, q, k, v, sinks(8), dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, seqused_k=used, **opts),
          (8, 30))


# ---------------------------------------------------------------------------------------
# Packed variants: the gradient reaches the packed tensor
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["qkvpacked", "kvpacked", "varlen_qkvpacked", "varlen_kvpacked"])
def test_packed(device, variant):
    dtype = torch.bfloat16
    H, d = 4, 32
    s_aux = sinks(H)
    varlen = variant.startswith("varlen")
    cu = torch.tensor([0, 17, 17, 40], dtype=torch.int32)
    shape = (40,) if varlen else (2, 20)
    q, k, v = (randn(*shape, H, d, dtype=dtype) for _ in range(3))
    if variant.endswith("qkvpacked"):
        packed = torch.stack((q, k, v), dim=-3)
        fn = fmha.flash_attn_varlen_qkvpacked_func if varlen else fmha.flash_attn_qkvpacked_func
        args = lambda x, dev: (x,) + ((cu.to(dev), 23) if varlen else ())  # noqa: E731
    else:
        packed = torch.stack((k, v), dim=-3)
        fn = fmha.flash_attn_varlen_kvpacked_func if varlen else fmha.flash_attn_kvpacked_func
        args = lambda x, dev: (q.to(dev), x) + ((cu.to(dev), cu.to(dev), 23, 23) if varlen else ())  # noqa: E731
    x, s = leaf(packed.to(device)), leaf(s_aux.to(device))
    dout = randn(*q.shape, dtype=dtype)
    with poisoned_outputs():
        out, lse, _ = fn(*args(x, device), causal=True, return_attn_probs=True, s_aux=s)
        out.backward(dout.to(device))
    ref_kw = dict(cu_seqlens_q=cu, cu_seqlens_k=cu) if varlen else {}
    ref = ref_grads(q, k, v, s_aux, dout, torch.zeros(lse.shape), causal=True, **ref_kw)
    grads = {"ds": s.grad.cpu()}
    if variant.endswith("qkvpacked"):
        grads.update(dq=x.grad[..., 0, :, :], dk=x.grad[..., 1, :, :], dv=x.grad[..., 2, :, :])
    else:
        grads.update(dk=x.grad[..., 0, :, :], dv=x.grad[..., 1, :, :])
    assert_close(out.detach().cpu(), ref["out"], OUT_TOL[dtype], "out")
    assert_lse_close(lse.cpu(), ref["lse"], LSE_TOL[dtype])
    floor = max(ref[n].norm().item() for n in ("dq", "dk", "dv"))
    for name, g in grads.items():
        assert_close(g.cpu(), ref[name], GRAD_TOL[dtype], name, floor=1e-2 * floor if name != "ds" else 0.0)


# ---------------------------------------------------------------------------------------
# flash_attn_with_kvcache (forward only)
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_kvcache(device, dtype):
    # Decode (one query) and a 3-query step after appending, one sequence with an empty
    # cache and nothing appended (only the sink: out 0, lse = s); out= written in place.
    B, Hq, Hk, S, d = 3, 8, 2, 64, 64
    kc, vc = randn(B, S, Hk, d, dtype=dtype), randn(B, S, Hk, d, dtype=dtype)
    s_aux = sinks(Hq)
    for sq, lengths in ((1, [0, 17, 64]), (3, [5, 30, 61])):
        q = randn(B, sq, Hq, d, dtype=dtype)
        new = None
        if sq == 3:
            new = (randn(B, sq, Hk, d, dtype=dtype), randn(B, sq, Hk, d, dtype=dtype))
        kc_d, vc_d = kc.clone().to(device), vc.clone().to(device)
        lens = torch.tensor(lengths, dtype=torch.int32)
        out = torch.full((B, sq, Hq, d), math.nan, dtype=dtype, device=device)
        with poisoned_outputs(module=fmha.kvcache):
            res, lse = fmha.flash_attn_with_kvcache(
                q.to(device), kc_d, vc_d, *(() if new is None else (new[0].to(device), new[1].to(device))),
                cache_seqlens=lens.to(device), causal=True, s_aux=s_aux.to(device), return_softmax_lse=True, out=out)
        assert res is out
        used = lens + (0 if new is None else sq)
        ref_out, ref_lse = attention_ref(q, kc_d.cpu(), vc_d.cpu(), seqused_k=used, causal=True, s_aux=s_aux)
        assert_close(out.cpu(), ref_out, OUT_TOL[dtype], f"out (sq={sq})")
        assert_lse_close(lse.cpu(), ref_lse, LSE_TOL[dtype], f"lse (sq={sq})")
        if sq == 1:
            assert (out[0] == 0).all() and torch.equal(lse[0].cpu(), s_aux[:, None])


def test_kvcache_sink_is_forward_only(device):
    q = randn(2, 1, 4, 32, dtype=torch.float16, device=device)
    kc, vc = (randn(2, 40, 2, 32, dtype=torch.float16, device=device) for _ in range(2))
    lengths = torch.tensor([17, 40], dtype=torch.int32, device=device)
    s = leaf(sinks(4).to(device))
    out = fmha.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lengths, s_aux=s)
    assert out.requires_grad
    with pytest.raises(RuntimeError, match="forward-only"):
        out.sum().backward()
    with torch.no_grad():
        assert torch.equal(out.detach(), fmha.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lengths,
                                                                       learnable_sink=s))


# ---------------------------------------------------------------------------------------
# torch.compile and dropout
# ---------------------------------------------------------------------------------------


def test_compile_fullgraph(device):
    q, k, v = (randn(2, 24, 4, 32, dtype=torch.float32, device=device) for _ in range(3))
    s = sinks(4).to(device)

    def step(q, k, v, s):
        return fmha.flash_attn_func(q, k, v, causal=True, s_aux=s)

    leaves = [leaf(t) for t in (q, k, v, s)]
    eager = step(*leaves)
    eager.sum().backward()
    cleaves = [leaf(t) for t in (q, k, v, s)]
    compiled = torch.compile(step, fullgraph=True)(*cleaves)
    compiled.sum().backward()
    assert_close(compiled.detach(), eager.detach(), 1e-6, "compiled out")
    for a, b, name in zip(cleaves, leaves, ("dq", "dk", "dv", "ds")):
        assert_close(a.grad, b.grad, 1e-6, f"compiled {name}")


def test_kvcache_compile_fullgraph(device):
    # The cache function's traced path (the registered op, then the sink's correction).
    q = randn(2, 1, 4, 32, dtype=torch.float32, device=device)
    kc, vc = (randn(2, 40, 2, 32, dtype=torch.float32, device=device) for _ in range(2))
    lengths = torch.tensor([17, 40], dtype=torch.int32, device=device)
    s = sinks(4).to(device)

    def step(q, kc, vc, lengths, s):
        return fmha.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lengths, s_aux=s, return_softmax_lse=True)

    eager = step(q, kc, vc, lengths, s)
    compiled = torch.compile(step, fullgraph=True)(q, kc, vc, lengths, s)
    # The compiled sink correction may fuse and round differently from the eager one.
    assert_close(compiled[0], eager[0], 1e-6, "compiled out")
    assert_close(compiled[1], eager[1], 1e-6, "compiled lse")
    ref_out, ref_lse = attention_ref(q.cpu(), kc.cpu(), vc.cpu(), seqused_k=lengths.cpu(), s_aux=s.cpu())
    assert_close(compiled[0].cpu(), ref_out, OUT_TOL[torch.float32], "out")
    assert_lse_close(compiled[1].cpu(), ref_lse, LSE_TOL[torch.float32])


def test_dropout(device):
    # Dropout on the keys' probabilities (the sink has no value to drop): out and every
    # gradient against the reference with the kernel's own keep-mask.
    from reference import dropout_keep_mask
    B, S, H, d, p = 2, 32, 2, 32, 0.25
    q, k, v = (randn(B, S, H, d, dtype=torch.float32) for _ in range(3))
    s_aux, dout = sinks(H), randn(B, S, H, d, dtype=torch.float32)
    ql, kl, vl, sl = (leaf(t.to(device)) for t in (q, k, v, s_aux))
    out, lse, rng, _ = fmha.ops.attention(ql, kl, vl, None, None, None, S, S, d ** -0.5, 0.0, -1, 0, False, None,
                                          p, False, False, None, s_aux=sl)
    out.backward(dout.to(device))
    keep = torch.from_numpy(dropout_keep_mask(*rng.tolist(), p, H, S, S, batch=B))
    ref = ref_grads(q, k, v, s_aux, dout, torch.zeros(B, H, S), causal=True, dropout_p=p, keep_mask=keep)
    res = {"out": out.detach().cpu(), "lse": lse.detach().cpu(), "dq": ql.grad.cpu(), "dk": kl.grad.cpu(),
           "dv": vl.grad.cpu(), "ds": sl.grad.cpu()}
    compare(res, ref, torch.float32)


# ---------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------

# (what, make(q) -> keywords, exception, message)
SINK_ERRORS = [
    ("type", lambda q: dict(s_aux=[0.0] * 4), TypeError, "s_aux must be a torch.Tensor"),
    ("dtype", lambda q: dict(s_aux=torch.zeros(4, dtype=torch.float64, device=q.device)), TypeError,
     r"s_aux must be torch.float32 or q's dtype torch.float16"),
    ("int", lambda q: dict(learnable_sink=torch.zeros(4, dtype=torch.int32, device=q.device)), TypeError,
     "learnable_sink must be torch.float32"),
    ("shape kv heads", lambda q: dict(s_aux=torch.zeros(2, device=q.device)), ValueError,
     r"s_aux must have shape \(4,\) \(one logit per query head\)"),
    ("shape 2-D", lambda q: dict(s_aux=torch.zeros(1, 4, device=q.device)), ValueError, r"s_aux must have shape"),
    ("both", lambda q: dict(s_aux=torch.zeros(4, device=q.device), learnable_sink=torch.zeros(4, device=q.device)),
     ValueError, "s_aux or learnable_sink, not both"),
]


@pytest.mark.parametrize("what,make,exc,match", SINK_ERRORS, ids=[e[0] for e in SINK_ERRORS])
def test_errors(device, what, make, exc, match):
    q, k, v = (randn(2, 8, 4, 32, dtype=torch.float16, device=device) for _ in range(3))
    with pytest.raises(exc, match=match):
        fmha.flash_attn_func(q, k, v, **make(q))
    cu = torch.tensor([0, 16], dtype=torch.int32, device=device)
    with pytest.raises(exc, match=match):
        fmha.flash_attn_varlen_func(q.reshape(16, 4, 32), k.reshape(16, 4, 32), v.reshape(16, 4, 32), cu, cu, 16, 16,
                                    **make(q))
    with pytest.raises(exc, match=match):
        fmha.flash_attn_qkvpacked_func(torch.stack((q, k, v), dim=2), **make(q))
    with pytest.raises(exc, match=match):
        fmha.flash_attn_with_kvcache(q, k, v, cache_seqlens=torch.tensor([3, 8], dtype=torch.int32, device=device),
                                     **make(q))


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_sink_on_cpu(bad):
    q, k, v = (randn(2, 8, 4, 32, dtype=torch.float32) for _ in range(3))
    s = torch.zeros(4)
    s[2] = bad
    with pytest.raises(ValueError, match="s_aux must be finite"):
        fmha.flash_attn_func(q, k, v, s_aux=s)
    with pytest.raises(ValueError, match="s_aux must be finite"):
        fmha.flash_attn_with_kvcache(q, k, v, cache_seqlens=8, s_aux=s)


def test_sink_device_mismatch(device):
    if not other_device_available():
        pytest.skip("needs a second device")
    q, k, v = (randn(2, 8, 4, 32, dtype=torch.float16, device=device) for _ in range(3))
    other = "cpu" if device != "cpu" else "cuda"
    with pytest.raises(ValueError, match="s_aux is on"):
        fmha.flash_attn_func(q, k, v, s_aux=torch.zeros(4, device=other))
