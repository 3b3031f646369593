"""torch.compile(fullgraph=True) traces through the fmha ops (fake implementations and
registered autograd) with no graph break, and the compiled function matches eager; and
torch.library.opcheck accepts the ops.  Kept few: compiling is slow on a small CPU."""

import pytest
import torch

import fmha
from conftest import leaf, randn


def _grads_of(fn, inputs, dout):
    leaves = [leaf(t) for t in inputs]
    out = fn(*leaves)
    out.backward(dout)
    return [out.detach()] + [t.grad for t in leaves]


def _fixed(causal):
    def f(q, k, v):
        # Ops around the call, so the graph is more than the custom op alone.
        return fmha.flash_attn_func(q * 1.5, k, v, causal=causal).float().sin()
    return f


def _varlen(q, k, v):
    cu_q = torch.tensor([0, 5, 12, 30], dtype=torch.int32, device=q.device)
    cu_k = torch.tensor([0, 9, 9, 30], dtype=torch.int32, device=q.device)
    return fmha.flash_attn_varlen_func(q * 1.5, k, v, cu_q, cu_k, 18, 21, causal=True).float().sin()


def _dropout(q, k, v):
    return fmha.flash_attn_func(q, k, v, dropout_p=0.3, causal=True).float().sin()


CASES = {
    "fixed": (_fixed(False), (2, 17, 4, 32), (2, 23, 2, 32), "aot_eager"),
    "fixed-causal": (_fixed(True), (2, 17, 4, 32), (2, 23, 2, 32), "inductor"),
    "varlen-causal": (_varlen, (30, 4, 32), (30, 2, 32), "inductor"),
    # The op draws (seed, offset) from torch's generator at run time, also when compiled:
    # the same torch.manual_seed gives the same mask compiled and eager.
    "dropout": (_dropout, (2, 17, 4, 32), (2, 23, 2, 32), "aot_eager"),
}


# aot_eager runs dynamo and AOTAutograd (the parts that need the fake implementations and
# the autograd registration) without code generation; one case uses the default inductor
# backend end to end.
@pytest.mark.parametrize("case", list(CASES))
def test_compile_fullgraph_matches_eager(device, case):
    fn, shape_q, shape_k, backend = CASES[case]
    torch._dynamo.reset()
    q = randn(*shape_q, device=device)
    k, v = randn(*shape_k, device=device), randn(*shape_k, device=device)
    dout = randn(*shape_q, dtype=torch.float32, device=device)
    # fullgraph=True raises on any graph break, so compiling at all is the check.
    compiled = torch.compile(fn, fullgraph=True, backend=backend)
    torch.manual_seed(5)
    got = _grads_of(compiled, (q, k, v), dout)
    torch.manual_seed(5)
    want = _grads_of(fn, (q, k, v), dout)
    # The compiled graph calls the same op on the same values, and the ops around it are
    # elementwise, so results agree to fp32 rounding of the surrounding ops.
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=f"{case}: {name}")


def _paged(q, kc, vc, cu_q, used, table):
    return fmha.flash_attn_varlen_func(q, kc, vc, cu_seqlens_q=cu_q, max_seqlen_q=3, seqused_k=used,
                                       max_seqlen_k=70, block_table=table, causal=True, s_aux=q[0, :, 0])


def _append(q, kc, vc, kn, vn, lens):
    return fmha.flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=lens, causal=True,
                                        return_softmax_lse=True)


# The serving calls, forward only.  Their lengths are tensors whose values the eager path
# checks against the block table and cache when they are on the CPU; a trace must not read them.
def test_compile_fullgraph_serving_calls(device):
    torch._dynamo.reset()
    kc, vc = randn(10, 16, 2, 32, device=device), randn(10, 16, 2, 32, device=device)
    table = torch.randperm(10, dtype=torch.int32).view(2, 5).to(device)
    cu_q = torch.tensor([0, 3, 4], dtype=torch.int32, device=device)
    used = torch.tensor([70, 33], dtype=torch.int32, device=device)
    q = randn(4, 4, 32, device=device)
    got = torch.compile(_paged, fullgraph=True, backend="aot_eager")(q, kc, vc, cu_q, used, table)
    assert torch.equal(got, _paged(q, kc, vc, cu_q, used, table)), "paged varlen: compiled != eager"

    kc, vc = randn(2, 80, 2, 32, device=device), randn(2, 80, 2, 32, device=device)
    kn, vn = randn(2, 1, 2, 32, device=device), randn(2, 1, 2, 32, device=device)
    lens = torch.tensor([50, 79], dtype=torch.int32, device=device)
    qd = randn(2, 1, 4, 32, device=device)
    caches = [(kc.clone(), vc.clone()) for _ in range(2)]
    got = torch.compile(_append, fullgraph=True, backend="aot_eager")(qd, *caches[0], kn, vn, lens)
    want = _append(qd, *caches[1], kn, vn, lens)
    for name, a, b in (("out", got[0], want[0]), ("lse", got[1], want[1]), ("k_cache", caches[0][0], caches[1][0]),
                       ("v_cache", caches[0][1], caches[1][1])):
        assert torch.equal(a, b), f"kvcache append: compiled {name} != eager"
    assert not torch.equal(caches[0][0], kc), "the compiled call did not append to the cache"


def test_explain_reports_no_graph_break():
    q, k, v = (randn(1, 9, 2, 16) for _ in range(3))
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(_fixed(True))(q, k, v)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


def _fwd_args(device, dropout_p=0.0, varlen=False):
    q = randn(2, 6, 2, 8, dtype=torch.float32, device=device).requires_grad_()
    k = randn(2, 7, 1, 8, dtype=torch.float32, device=device).requires_grad_()
    v = randn(2, 7, 1, 8, dtype=torch.float32, device=device).requires_grad_()
    cu_q = cu_k = None
    if varlen:
        q, k, v = (t.detach().flatten(0, 1).requires_grad_() for t in (q, k, v))
        cu_q = torch.tensor([0, 4, 12], dtype=torch.int32, device=device)
        cu_k = torch.tensor([0, 7, 14], dtype=torch.int32, device=device)
    rng = torch.tensor([11, 22], dtype=torch.int64) if dropout_p > 0 else None
    return (q, k, v, cu_q, cu_k, None, 8 if varlen else 6, 7, 8 ** -0.5, 0.0, -1, 0, False, None,
            dropout_p, True, dropout_p > 0, rng)


def _assert_same(variant, name, eager, op):
    """The eager path's result equals the op's, bit for bit; where the op returns a placeholder
    (the RNG state without dropout, zeros; the probabilities when not asked for, empty), the
    eager path returns None instead."""
    if eager is None:
        assert name in ("rng_state", "probs"), f"{variant}: {name} is None on the eager path"
        placeholder = op.numel() == 0 if name == "probs" else (op.numel() == 2 and not op.any())
        assert placeholder, f"{variant}: the eager path gave no {name}, the op gave {op}"
    else:
        assert torch.equal(eager, op), f"{variant}: {name} differs between the eager path and the op"


@pytest.mark.parametrize("variant", ["fixed", "varlen-dropout"])
def test_opcheck_fwd(device, variant):
    # Schema, fake (meta) implementation, autograd registration and AOT dispatch.  With
    # dropout the explicit rng_state keeps the op a pure function of its inputs.
    args = _fwd_args(device, dropout_p=0.3 if "dropout" in variant else 0.0,
                     varlen=variant.startswith("varlen"))
    torch.library.opcheck(torch.ops.fmha.fwd.default, args)


def test_opcheck_bwd(device):
    args = _fwd_args(device)
    out, lse, rng_state, _ = torch.ops.fmha.fwd(*[a.detach() if isinstance(a, torch.Tensor) else a
                                                  for a in args])
    q, k, v = (a.detach() for a in args[:3])
    dout = torch.randn_like(out)
    bwd_args = (dout, q, k, v, out, lse, None, None, None, None, 6, 7, 8 ** -0.5, 0.0, -1, 0,
                False, None, 0.0, rng_state, True)
    torch.library.opcheck(torch.ops.fmha.bwd.default, bwd_args)


@pytest.mark.parametrize("variant", ["fixed", "varlen-dropout"])
def test_eager_path_matches_registered_op(device, variant):
    """Eager calls skip the dispatcher (ops.attention); they must give bit for bit what the
    registered op and its autograd give, gradients through out and lse included."""
    from fmha import ops

    args = _fwd_args(device, dropout_p=0.3 if "dropout" in variant else 0.0,
                     varlen=variant.startswith("varlen"))
    assert all(type(a) is torch.Tensor for a in args[:3])

    def run(fn):
        leaves = [leaf(a) for a in args[:3]]
        out, lse, _rng, probs = fn(*leaves, *args[3:])
        paths.append(type(out.grad_fn).__name__)
        g = torch.Generator().manual_seed(3)
        (out.float() * torch.randn(out.shape, generator=g).to(out.device)).sum().backward(retain_graph=True)
        (lse * torch.randn(lse.shape, generator=g).to(lse.device)).sum().backward()
        return [out.detach(), lse.detach(), probs] + [t.grad for t in leaves]

    paths = []
    got = run(ops.attention)
    want = run(torch.ops.fmha.fwd)
    for name, a, b in zip(("out", "lse", "probs", "dq", "dk", "dv"), got, want):
        _assert_same(variant, name, a, b)
    assert "EagerAttention" in paths[0] and "EagerAttention" not in paths[1], paths

    # Nothing to differentiate (no_grad): the eager path calls the forward directly, with
    # no autograd node, and gives the op's results bit for bit.
    with torch.no_grad():
        leaves = [leaf(a) for a in args[:3]]
        got = ops.attention(*leaves, *args[3:])
        want = torch.ops.fmha.fwd(*leaves, *args[3:])
    assert got[0].grad_fn is None and not got[0].requires_grad
    for name, a, b in zip(("out", "lse", "rng_state", "probs"), got, want):
        _assert_same(variant + " (no grad)", name, a, b)
