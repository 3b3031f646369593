"""Gradients of fixed-length attention against float64 autograd of the reference, for
every feature; zero gradients where nothing is seen; bitwise determinism; packed variants."""

import itertools

import pytest
import torch

import fmha
from conftest import (DTYPES, FULL, GRAD_TOL, assert_all_finite, assert_close,
                      check_backward, dtype_id, flash_call, leaf, op_call, poison_memory,
                      poisoned_outputs, randn, varlen_call)
from reference import attention_ref, attention_ref_grads


def qkv(B, sq, sk, hq, hk, d, dtype, scale=1.0):
    return (randn(B, sq, hq, d, dtype=dtype, scale=scale), randn(B, sk, hk, d, dtype=dtype),
            randn(B, sk, hk, d, dtype=dtype))


SEQLENS = [(1, 1), (7, 33), (33, 7), (65, 65), (127, 100)]
if FULL:
    SEQLENS += [(1, 64), (64, 1), (128, 128), (200, 333), (513, 700)]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("sq,sk", SEQLENS, ids=[f"sq{a}-sk{b}" for a, b in SEQLENS])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_seqlens(device, dtype, sq, sk, causal):
    q, k, v = qkv(2, sq, sk, 2, 2, 32, dtype)
    check_backward(device, q, k, v, flash_call(causal=causal), dict(causal=causal))


HEAD_DIMS = [1, 8, 31, 32, 40, 64, 80, 96, 128, 160, 192, 256]
# Every head-dim class; the quick suite rotates the dtype over them.
HEAD_DIM_CASES = [(d, t) for d in HEAD_DIMS for t in DTYPES] if FULL else \
    [(d, DTYPES[n % 3]) for n, d in enumerate(HEAD_DIMS)]


@pytest.mark.parametrize("d,dtype", HEAD_DIM_CASES,
                         ids=[f"d{d}-{dtype_id(t)}" for d, t in HEAD_DIM_CASES])
def test_head_dims(device, d, dtype):
    q, k, v = qkv(2, 29, 37, 2, 1, d, dtype)
    check_backward(device, q, k, v, flash_call(causal=True), dict(causal=True))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_dtypes(device, dtype, causal):
    q, k, v = qkv(2, 64, 77, 4, 2, 64, dtype)
    check_backward(device, q, k, v, flash_call(causal=causal), dict(causal=causal))


# dK/dV of a shared KV head sum over its group of query heads.
HEADS = [(4, 4), (4, 2), (8, 2), (6, 1)]


@pytest.mark.parametrize("hq,hk", HEADS, ids=[f"hq{a}-hk{b}" for a, b in HEADS])
def test_gqa_mqa(device, hq, hk):
    q, k, v = qkv(2, 33, 41, hq, hk, 32, torch.float32)
    check_backward(device, q, k, v, flash_call(causal=True), dict(causal=True))


WINDOWS = [
    (48, 48, (8, 8), False),
    (33, 65, (16, -1), False),
    (40, 70, (5, -1), True),
    (60, 20, (2, 1), False),  # rows 0..38 see nothing
]


@pytest.mark.parametrize("sq,sk,window,causal", WINDOWS,
                         ids=[f"sq{a}-sk{b}-w{w[0]}_{w[1]}{'-causal' if c else ''}"
                              for a, b, w, c in WINDOWS])
def test_sliding_window(device, sq, sk, window, causal):
    q, k, v = qkv(2, sq, sk, 2, 1, 32, torch.float16)
    opts = dict(window_size=window, causal=causal)
    check_backward(device, q, k, v, flash_call(**opts), opts)


def test_unseen_keys_and_rows_get_zero_grads(device):
    # window (0, 0) with Sq=20, Sk=60: query i sees only key i + 40, so keys 0..39 are seen
    # by nobody (dk, dv exactly 0).  Causal with Sq=30 > Sk=10: rows 0..19 see nothing
    # (dq exactly 0, checked by check_backward).
    q, k, v = qkv(2, 20, 60, 2, 2, 16, torch.float16)
    res = check_backward(device, q, k, v, flash_call(window_size=(0, 0)), dict(window_size=(0, 0)))
    assert (res["dk"][:, :40] == 0).all() and (res["dv"][:, :40] == 0).all()
    assert res["dv"][:, 40:].abs().sum() > 0
    q, k, v = qkv(2, 30, 10, 2, 2, 16, torch.float16)
    res = check_backward(device, q, k, v, flash_call(causal=True), dict(causal=True))
    assert (res["dq"][:, :20] == 0).all()


@pytest.mark.parametrize("softcap", [2.0, 30.0])
def test_softcap(device, softcap):
    q, k, v = qkv(2, 41, 57, 4, 2, 64, torch.float16, scale=4.0)
    opts = dict(softcap=softcap, causal=True)
    check_backward(device, q, k, v, flash_call(**opts), opts)


@pytest.mark.parametrize("per_batch", [False, True], ids=["slopes_h", "slopes_bh"])
def test_alibi(device, per_batch):
    B, hq = 2, 4
    q, k, v = qkv(B, 30, 45, hq, 2, 32, torch.float16)
    slopes = torch.rand(B, hq) if per_batch else torch.rand(hq)
    opts = dict(alibi_slopes=slopes, causal=True)
    check_backward(device, q, k, v, flash_call(**opts), opts)


def test_softmax_scale(device):
    q, k, v = qkv(2, 31, 31, 2, 2, 64, torch.float32)
    opts = dict(softmax_scale=0.37)
    check_backward(device, q, k, v, flash_call(**opts), opts)


TOP_LEFT = [(33, 65, dict(causal=True)), (65, 33, dict(causal=True)),
            (40, 60, dict(window_size=(5, 3)))]


@pytest.mark.parametrize("sq,sk,opts", TOP_LEFT,
                         ids=[f"sq{a}-sk{b}-" + "-".join(o) for a, b, o in TOP_LEFT])
def test_top_left_alignment(device, sq, sk, opts):
    # Through torch.ops.fmha.fwd's registered autograd (flash_attn's API is bottom-right).
    q, k, v = qkv(2, sq, sk, 2, 2, 32, torch.float32)
    check_backward(device, q, k, v, op_call(top_left=True, **opts), dict(top_left=True, **opts))


@pytest.mark.parametrize("opts", [dict(causal=True), dict(window_size=(300, 40))], ids=["causal", "window"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=dtype_id)
def test_keys_in_several_cpu_chunks(device, dtype, opts):
    # The CPU backward takes the keys in chunks that stay in L2 (bwd_key_chunk in
    # csrc/cpu/tiles.inc: 256 keys at head dim 256), dQ carried from chunk to chunk: 600
    # keys are three chunks, the last one partial, and a window ends inside a chunk.
    q, k, v = qkv(1, 70, 600, 4, 2, 256, dtype)
    check_backward(device, q, k, v, flash_call(**opts), opts)


def test_long_sequence(device):
    q, k, v = qkv(1, 1024, 1024, 2, 1, 32, torch.float16)
    check_backward(device, q, k, v, flash_call(causal=True), dict(causal=True))


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_large_magnitude(device, dtype):
    # Near one-hot softmax: gradients must stay finite.  fp32 gets 10x its limit for the
    # score-size effect explained in test_forward.test_large_magnitude.
    q, k, v = qkv(2, 40, 40, 2, 2, 64, dtype, scale=30.0)
    dout = randn(*q.shape, dtype=dtype)
    ql, kl, vl = (leaf(t.to(device)) for t in (q, k, v))
    out = fmha.flash_attn_func(ql, kl, vl, causal=True)
    out.backward(dout.to(device))
    _, _, dq, dk, dv = attention_ref_grads(q, k, v, dout, causal=True)
    tol = GRAD_TOL[dtype] * (10 if dtype == torch.float32 else 1)
    for name, got, ref in (("dq", ql.grad, dq), ("dk", kl.grad, dk), ("dv", vl.grad, dv)):
        assert_all_finite(got, name)
        assert_close(got, ref, tol, name)


def test_gradient_through_lse(device):
    # The op's autograd takes the LSE's gradient too (used when partial results are merged
    # by their LSE): loss = sum(out * dout) + sum(lse * dlse).
    q, k, v = qkv(2, 30, 20, 2, 1, 32, torch.float32)
    dout, dlse = randn(2, 30, 2, 32, dtype=torch.float32), randn(2, 2, 30, dtype=torch.float32)
    ql, kl, vl = (leaf(t.to(device)) for t in (q, k, v))
    out, lse = flash_call(causal=True)(ql, kl, vl)
    torch.autograd.backward([out, lse], [dout.to(device), dlse.to(device)])

    refs = [leaf(t.double()) for t in (q, k, v)]
    ref_out, ref_lse = attention_ref(*refs, causal=True)
    # Rows that see nothing have LSE -inf and no gradient path; mask them out of the loss.
    finite = torch.isfinite(ref_lse)
    loss = (ref_out * dout.double()).sum() + (ref_lse[finite] * dlse.double()[finite]).sum()
    loss.backward()
    for name, got, ref in (("dq", ql.grad, refs[0].grad), ("dk", kl.grad, refs[1].grad),
                           ("dv", vl.grad, refs[2].grad)):
        assert_close(got, ref, GRAD_TOL[torch.float32], name)


@pytest.mark.parametrize("needs_grad", ["q", "kv"])
def test_gradient_for_some_inputs_only(device, needs_grad):
    # Inputs that do not require grad get none, and the others are still right.
    q, k, v = qkv(2, 25, 31, 4, 2, 32, torch.float32)
    dout = randn(2, 25, 4, 32, dtype=torch.float32)
    qd, kd, vd = (t.to(device) for t in (q, k, v))
    if needs_grad == "q":
        qd = leaf(qd)
    else:
        kd, vd = leaf(kd), leaf(vd)
    fmha.flash_attn_func(qd, kd, vd, causal=True).backward(dout.to(device))
    _, _, dq, dk, dv = attention_ref_grads(q, k, v, dout, causal=True)
    if needs_grad == "q":
        assert kd.grad is None and vd.grad is None
        assert_close(qd.grad, dq, GRAD_TOL[torch.float32], "dq")
    else:
        assert qd.grad is None
        assert_close(kd.grad, dk, GRAD_TOL[torch.float32], "dk")
        assert_close(vd.grad, dv, GRAD_TOL[torch.float32], "dv")


def test_noncontiguous_dout(device):
    # dout arrives as a transposed view (as after an SDPA-layout consumer).
    q, k, v = qkv(2, 33, 33, 4, 4, 32, torch.float16)
    dout = randn(2, 4, 33, 32, dtype=torch.float16).transpose(1, 2)
    check_backward(device, q, k, v, flash_call(causal=True), dict(causal=True), dout=dout)


def _grads(device, fn, tensors, dout):
    leaves = [leaf(t.to(device)) for t in tensors]
    with poisoned_outputs():
        fn(*leaves).backward(dout.to(device))
    return [t.grad.cpu() for t in leaves]


@pytest.mark.parametrize("deterministic", [True, False], ids=["deterministic", "default"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=dtype_id)
def test_deterministic_is_bitwise_reproducible(device, dtype, deterministic):
    # GQA + causal + window: dK/dV accumulate over query heads and tiles, where a
    # non-deterministic backward would add in varying order.  docs/api.md: the CPU
    # backward is always deterministic, GPU backwards when deterministic=True.
    if not deterministic and device != "cpu":
        pytest.skip("GPU backwards promise bitwise reproducibility only with deterministic=True")
    q, k, v = qkv(2, 150, 170, 8, 2, 64, dtype)
    dout = randn(2, 150, 8, 64, dtype=dtype)

    def fn(q, k, v):
        return fmha.flash_attn_func(q, k, v, causal=True, window_size=(50, -1),
                                    deterministic=deterministic)

    first = _grads(device, fn, (q, k, v), dout)
    poison_memory(*first)
    second = _grads(device, fn, (q, k, v), dout)
    for name, a, b in zip(("dq", "dk", "dv"), first, second):
        assert torch.equal(a, b), f"{name} differs between two runs of the same backward"


class _ShiftedWorkspace:
    """fmha._C with the backward's workspace handed over 4 bytes past a 256-byte boundary,
    as a C caller may: the sm90 kernel then adds dQ with atomics (its sm80-89 path) instead
    of bulk reductions, which need 16-byte alignment."""

    def __init__(self, C):
        self._C = C

    def __getattr__(self, name):
        return getattr(self._C, name)

    def bwd(self, *args):
        *args, alloc = args  # the last argument allocates the workspace
        return self._C.bwd(*args, lambda n: _Shifted(alloc(n + 4)))


class _Shifted:
    """A workspace tensor seen 4 bytes past its start (the tensor itself kept alive)."""

    def __init__(self, t):
        self._t = t

    def data_ptr(self):
        return self._t.data_ptr() + 4


# Varlen packs the rows so that a query block's accumulator rows start at every offset
# modulo 4 (the accumulator's column swizzle follows the row), and head dims cover every
# padded size the swizzle permutes within.
@pytest.mark.parametrize("d", [32, 64, 96, 128, 256])
def test_unaligned_workspace(device, d, monkeypatch):
    if device == "cpu":
        pytest.skip("the CPU backward takes no dQ accumulator")
    import fmha.ops
    monkeypatch.setattr(fmha.ops, "_C", _ShiftedWorkspace(fmha.ops._C))
    lens = [0, 70, 1, 133, 5]
    cu = torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32)
    total, h = int(cu[-1]), 3
    q, k, v = (randn(total, h, d, dtype=torch.bfloat16) for _ in range(3))
    check_backward(device, q, k, v, varlen_call(cu, cu, max(lens), max(lens), causal=True),
                   dict(causal=True, cu_seqlens_q=cu, cu_seqlens_k=cu))


def _assert_same(got, want, device, dtype, what):
    # The packed functions call the same op on views of the same values, so on the CPU the
    # results are identical; GPU kernels may pick another tile config by stride/alignment,
    # so there only the gradient tolerance applies.
    if device == "cpu":
        assert torch.equal(got, want), f"{what}: packed and unpacked gradients differ"
    else:
        assert_close(got, want, GRAD_TOL[dtype], what)


@pytest.mark.parametrize("variant", ["qkvpacked", "kvpacked", "varlen_qkvpacked", "varlen_kvpacked"])
def test_packed_gradients_equal_unpacked(device, variant):
    dtype, B, S, H, D = torch.float16, 2, 37, 4, 32
    Hk = H if "qkvpacked" in variant else 2  # kvpacked variants also cover GQA
    q, k, v = qkv(B, S, S, H, Hk, D, dtype)
    dout = randn(B, S, H, D, dtype=dtype)
    opts = dict(causal=True, deterministic=True)
    cu = torch.arange(0, B * S + 1, S, dtype=torch.int32)  # B sequences of length S
    flat = lambda x: x.reshape(B * S, *x.shape[2:])  # noqa: E731

    # The packed tensor, built from the same values as q, k, v.
    if variant == "qkvpacked":
        ins = torch.stack([q, k, v], dim=2)
    elif variant == "kvpacked":
        ins = torch.stack([k, v], dim=2)
    elif variant == "varlen_qkvpacked":
        ins = torch.stack([flat(q), flat(k), flat(v)], dim=1)
    else:
        ins = torch.stack([flat(k), flat(v)], dim=1)

    def run_packed(q_, x):
        c = cu.to(x.device)
        if variant == "qkvpacked":
            return fmha.flash_attn_qkvpacked_func(x, **opts)
        if variant == "kvpacked":
            return fmha.flash_attn_kvpacked_func(q_, x, **opts)
        if variant == "varlen_qkvpacked":
            return fmha.flash_attn_varlen_qkvpacked_func(x, c, S, **opts)
        return fmha.flash_attn_varlen_kvpacked_func(q_, x, c, c, S, S, **opts)

    def run_unpacked(q_, k_, v_):
        c = cu.to(q_.device)
        if variant.startswith("varlen"):
            return fmha.flash_attn_varlen_func(q_, k_, v_, c, c, S, S, **opts)
        return fmha.flash_attn_func(q_, k_, v_, **opts)

    varlen = variant.startswith("varlen")
    qv, kv_, vv, dv_out = (flat(x) if varlen else x for x in (q, k, v, dout))
    dim = 1 if varlen else 2
    # Packed: gradient into the packed tensor (and q where it is separate).
    if variant.endswith("qkvpacked"):
        (d_packed,) = _grads(device, lambda x: run_packed(None, x), (ins,), dv_out)
        d_q, d_k, d_v = d_packed.unbind(dim)
    else:
        d_q, d_packed = _grads(device, run_packed, (qv, ins), dv_out)
        d_k, d_v = d_packed.unbind(dim)
    want = _grads(device, run_unpacked, (qv, kv_, vv), dv_out)
    for name, got, ref in zip(("dq", "dk", "dv"), (d_q, d_k, d_v), want):
        _assert_same(got, ref, device, dtype, f"{variant} {name}")
    # And the unpacked gradients are right (so the equality above is not vacuous).
    _, _, rq, rk, rv = attention_ref_grads(q, k, v, dout, causal=True)
    assert_close(want[0], rq.reshape(want[0].shape), GRAD_TOL[dtype], "dq")
    assert_close(want[1], rk.reshape(want[1].shape), GRAD_TOL[dtype], "dk")
    assert_close(want[2], rv.reshape(want[2].shape), GRAD_TOL[dtype], "dv")


if FULL:
    # FMHA_TEST_FULL=1: head dim x lengths x causal x dtype, crossed, with GQA.
    SWEEP = list(itertools.product([32, 64, 128, 256], [(1, 1), (113, 203), (255, 17)],
                                   [False, True], DTYPES))

    @pytest.mark.parametrize("d,seqlens,causal,dtype", SWEEP,
                             ids=[f"d{d}-sq{s[0]}-sk{s[1]}-{'causal' if c else 'full'}-{dtype_id(t)}"
                                  for d, s, c, t in SWEEP])
    def test_full_sweep(device, d, seqlens, causal, dtype):
        q, k, v = qkv(2, *seqlens, 4, 2, d, dtype)
        check_backward(device, q, k, v, flash_call(causal=causal), dict(causal=causal))



SPLIT_CASES = {
    # (B, Sq, Sk, Hq, Hk, D, options): one (sequence, KV head) pair or two, so that more
    # threads than pairs split the CPU backward's work (bwd_split in attention_bwd.cpp).
    "mha-causal-3-chunks": (1, 1100, 1100, 1, 1, 128, dict(causal=True)),
    "gqa-window-softcap": (1, 300, 450, 6, 2, 40, dict(window_size=(100, 20), softcap=20.0)),
    "alibi-dropout": (2, 97, 130, 2, 1, 64, dict(alibi_slopes=torch.tensor([0.3, 0.05]), dropout_p=0.2)),
    "varlen-empty-sequence": None,
}


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("case", list(SPLIT_CASES))
def test_cpu_backward_split_over_threads(case, dtype, monkeypatch):
    """Where a call's (sequence, KV head) pairs are fewer than the threads, the CPU backward
    cuts each pair's keys into ranges for dK and dV and its query heads' rows into ranges for
    dQ, the same tiles in the same orders of summation as one item per pair (bf16 at head
    dims that are multiples of 32 on AMX tiles where the CPU has them): the gradients (an
    LSE gradient included) must be bit-identical to one thread's, and match float64."""
    torch.manual_seed(5)
    if SPLIT_CASES[case] is None:
        seqs_q, seqs_k, hq, hk, d, opts = [70, 0, 300], [90, 40, 260], 3, 1, 96, dict(causal=True)
        q, k, v = (randn(sum(s), h, d, dtype=dtype) for s, h in ((seqs_q, hq), (seqs_k, hk), (seqs_k, hk)))
        cu = [torch.tensor([0] + list(itertools.accumulate(s)), dtype=torch.int32) for s in (seqs_q, seqs_k)]
        call = varlen_call(cu[0], cu[1], max(seqs_q), max(seqs_k), **opts)
        ref_opts = dict(cu_seqlens_q=cu[0], cu_seqlens_k=cu[1], **opts)
    else:
        B, sq, sk, hq, hk, d, opts = SPLIT_CASES[case]
        q, k, v = qkv(B, sq, sk, hq, hk, d, dtype)
        call = flash_call(**opts)
        ref_opts = opts
    dout = torch.randn(q.shape).to(dtype)

    def grads(threads, with_dlse=True):
        monkeypatch.setenv("FMHA_NUM_THREADS", str(threads))
        torch.manual_seed(11)  # the same dropout mask on every run
        ql, kl, vl = (leaf(t) for t in (q, k, v))
        out, lse = call(ql, kl, vl)
        dlse = torch.randn(lse.shape, generator=torch.Generator().manual_seed(2))
        dlse = torch.where(torch.isfinite(lse), dlse, 0.) if with_dlse else torch.zeros_like(lse)
        torch.autograd.backward([out, lse], [dout, dlse])
        return out, ql.grad, kl.grad, vl.grad

    one = grads(1)
    split = grads(7)  # more threads than pairs: the split path, whatever this machine's cores
    for name, a, b in zip(("out", "dq", "dk", "dv"), one, split):
        assert_all_finite(b, name)
        assert torch.equal(a, b), f"{case}: {name} differs between one thread and the split backward"
    if "dropout_p" not in opts:  # (with dropout the bits above are the check: the float64
        # reference would need the mask, which tests/test_dropout.py checks on its own)
        _, _, *ref = attention_ref_grads(q, k, v, dout, **ref_opts)
        for name, got, want in zip(("dq", "dk", "dv"), grads(7, with_dlse=False)[1:], ref):
            assert_close(got, want, GRAD_TOL[dtype], f"{case}: {name}")
