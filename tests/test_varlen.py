"""flash_attn_varlen_func: packed sequences of different lengths (some empty), seqused_k,
rows outside every sequence, per-sequence masks, GQA, ALiBi per sequence; forward and
gradients against the float64 reference."""

import itertools

import pytest
import torch

from conftest import (DTYPES, FULL, check_backward, check_forward, dtype_id, randn,
                      varlen_call)


def varlen_inputs(lens_q, lens_k, hq, hk, d, dtype, pad_q=(0, 0), pad_k=(0, 0)):
    """Packed q, k, v and int32 cu_seqlens for these sequence lengths.  pad = (rows before
    cu_seqlens[0], rows after cu_seqlens[B]): rows that belong to no sequence."""
    def cu(lens, pad):
        offs = [pad[0]]
        for n in lens:
            offs.append(offs[-1] + n)
        return torch.tensor(offs, dtype=torch.int32), offs[-1] + pad[1]
    cu_q, total_q = cu(lens_q, pad_q)
    cu_k, total_k = cu(lens_k, pad_k)
    q = randn(total_q, hq, d, dtype=dtype)
    k = randn(total_k, hk, d, dtype=dtype)
    v = randn(total_k, hk, d, dtype=dtype)
    return q, k, v, cu_q, cu_k


# Each case: lengths of q and k per sequence, (Hq, Hk), and options.
CASES = {
    "self-causal": dict(lens_q=[3, 17, 1, 64], lens_k=[3, 17, 1, 64], opts=dict(causal=True)),
    "self-full": dict(lens_q=[3, 17, 1, 64], lens_k=[3, 17, 1, 64], opts=dict()),
    # Sq > Sk in some sequences: bottom-right causal leaves their first rows empty.
    "cross-causal": dict(lens_q=[5, 33, 12], lens_k=[40, 7, 12], opts=dict(causal=True)),
    # Sequences with no queries, no keys, or neither.
    "empty-sequences": dict(lens_q=[0, 5, 7, 0, 9], lens_k=[4, 0, 9, 0, 16],
                            opts=dict(causal=True)),
    "seqused_k": dict(lens_q=[6, 10, 8, 4], lens_k=[20, 15, 30, 9], seqused=[5, 0, 30, 3],
                      opts=dict(causal=True)),
    # cu_seqlens[0] > 0 and cu_seqlens[B] < total: those rows must come out 0 / LSE -inf.
    "rows-outside": dict(lens_q=[7, 9], lens_k=[8, 11], pad_q=(3, 5), pad_k=(2, 4),
                         opts=dict()),
    # max_seqlen is a bound, not the exact maximum.
    "loose-max-seqlen": dict(lens_q=[7, 9], lens_k=[8, 11], max_extra=10, opts=dict(causal=True)),
    "window": dict(lens_q=[40, 25, 50], lens_k=[40, 60, 20], opts=dict(window_size=(6, 2))),
    "gqa": dict(lens_q=[13, 31], lens_k=[17, 31], heads=(6, 2), opts=dict(causal=True)),
    "mqa-softcap": dict(lens_q=[13, 31], lens_k=[17, 31], heads=(4, 1),
                        opts=dict(softcap=3.0)),
    # ALiBi slopes per sequence and head, distances per sequence.
    "alibi-bh": dict(lens_q=[13, 31, 8], lens_k=[20, 31, 3], alibi="bh", opts=dict(causal=True)),
    "alibi-h": dict(lens_q=[13, 31], lens_k=[20, 31], alibi="h", opts=dict()),
}


def build(case, dtype):
    hq, hk = case.get("heads", (2, 2))
    q, k, v, cu_q, cu_k = varlen_inputs(case["lens_q"], case["lens_k"], hq, hk, 32, dtype,
                                        case.get("pad_q", (0, 0)), case.get("pad_k", (0, 0)))
    extra = case.get("max_extra", 0)
    max_q, max_k = max(case["lens_q"]) + extra, max(case["lens_k"]) + extra
    opts = dict(case["opts"])
    if "seqused" in case:
        opts["seqused_k"] = torch.tensor(case["seqused"], dtype=torch.int32)
    if case.get("alibi") == "bh":
        opts["alibi_slopes"] = torch.rand(len(case["lens_q"]), hq)
    elif case.get("alibi") == "h":
        opts["alibi_slopes"] = torch.rand(hq)
    call = varlen_call(cu_q, cu_k, max_q, max_k, **opts)
    ref_kwargs = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, **opts)
    return q, k, v, call, ref_kwargs


CASE_PARAMS = list(itertools.product(CASES, DTYPES))
CASE_IDS = [f"{n}-{dtype_id(t)}" for n, t in CASE_PARAMS]


@pytest.mark.parametrize("case,dtype", CASE_PARAMS, ids=CASE_IDS)
def test_forward(device, case, dtype):
    q, k, v, call, ref_kwargs = build(CASES[case], dtype)
    check_forward(device, q, k, v, call, ref_kwargs)


@pytest.mark.parametrize("case,dtype", CASE_PARAMS, ids=CASE_IDS)
def test_backward(device, case, dtype):
    q, k, v, call, ref_kwargs = build(CASES[case], dtype)
    check_backward(device, q, k, v, call, ref_kwargs)


def test_unused_rows_get_zero_gradients(device):
    # Keys past seqused_k and rows outside every sequence take no part: their gradients
    # are exactly 0, as are the gradients of queries of a sequence whose seqused_k is 0.
    lens_q, lens_k, seqused = [6, 10], [20, 15], [5, 0]
    q, k, v, cu_q, cu_k = varlen_inputs(lens_q, lens_k, 2, 2, 32, torch.float16,
                                        pad_q=(2, 3), pad_k=(1, 2))
    su = torch.tensor(seqused, dtype=torch.int32)
    call = varlen_call(cu_q, cu_k, 10, 20, causal=True, seqused_k=su)
    res = check_backward(device, q, k, v, call,
                         dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, seqused_k=su, causal=True))
    k0 = int(cu_k[0])
    unused_k = torch.ones(k.shape[0], dtype=torch.bool)
    unused_k[k0:k0 + seqused[0]] = False  # only the first 5 keys of sequence 0 are used
    for name in ("dk", "dv"):
        assert (res[name][unused_k] == 0).all(), f"{name} of unused keys must be 0"
        assert res[name][~unused_k].abs().sum() > 0
    q1 = slice(int(cu_q[1]), int(cu_q[2]))  # sequence 1 sees no key at all
    assert (res["dq"][q1] == 0).all() and (res["out"][q1] == 0).all()
    assert (res["dq"][:2] == 0).all() and (res["dq"][-3:] == 0).all()


def test_long_packed_batch(device):
    # Many sequences of assorted lengths, up to 300 (1000 in the full suite), in one call.
    lens = [1, 300, 17, 64, 0, 129, 255, 33] + ([1000, 513] if FULL else [])
    q, k, v, cu_q, cu_k = varlen_inputs(lens, lens[::-1], 4, 2, 32, torch.bfloat16)
    call = varlen_call(cu_q, cu_k, max(lens), max(lens), causal=True)
    ref_kwargs = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=True)
    check_forward(device, q, k, v, call, ref_kwargs)
    check_backward(device, q, k, v, call, ref_kwargs)
