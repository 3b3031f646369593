"""Forward pass (out and LSE) of fixed-length attention against the float64 reference:
sequence lengths, head dims, dtypes, GQA/MQA, masks in both alignments, softcap, ALiBi,
empty rows, long sequences, large magnitudes and strided inputs; window_size as any pair of
integers."""

import itertools

import pytest
import torch
import torch.nn.functional as F

import fmha
from conftest import (DTYPES, FULL, OUT_TOL, assert_all_finite, check_forward, dtype_id,
                      flash_call, op_call, randn)
from reference import attention_ref, torch_sdpa

HEAD_DIMS = [1, 8, 31, 32, 40, 64, 80, 96, 128, 160, 192, 256]


def qkv(B, sq, sk, hq, hk, d, dtype, scale=1.0):
    return (randn(B, sq, hq, d, dtype=dtype, scale=scale), randn(B, sk, hk, d, dtype=dtype),
            randn(B, sk, hk, d, dtype=dtype))


def test_reference_matches_torch_sdpa():
    # The reference itself, against torch's math SDPA in float64 (top-left causal, GQA):
    # guards every other test in the suite against a wrong reference.
    q = torch.randn(2, 4, 13, 16, dtype=torch.float64)
    k = torch.randn(2, 2, 21, 16, dtype=torch.float64)
    v = torch.randn(2, 2, 21, 16, dtype=torch.float64)
    for causal in (False, True):
        want = torch_sdpa(q, k, v, is_causal=causal, enable_gqa=True)
        got, _ = attention_ref(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                               causal=causal, top_left=True)
        torch.testing.assert_close(got.transpose(1, 2), want, rtol=1e-12, atol=1e-12)


# Sequence lengths off every tile multiple, length 1, and Sq != Sk both ways (with causal,
# Sq > Sk leaves the first Sq - Sk rows with no key: bottom-right alignment).
SEQLENS = [(1, 1), (7, 7), (1, 33), (33, 1), (33, 65), (65, 33), (127, 127), (128, 97)]
if FULL:
    SEQLENS += [(16, 16), (64, 128), (113, 203), (256, 256), (255, 17), (512, 383),
                (1023, 2049)]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("sq,sk", SEQLENS, ids=[f"sq{a}-sk{b}" for a, b in SEQLENS])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_seqlens(device, dtype, sq, sk, causal):
    q, k, v = qkv(2, sq, sk, 2, 2, 32, dtype)
    check_forward(device, q, k, v, flash_call(causal=causal), dict(causal=causal))


# Every head-dim class in every dtype; the quick suite alternates causal over them, the
# full suite crosses it too.
if FULL:
    HEAD_DIM_CASES = list(itertools.product(HEAD_DIMS, DTYPES, [False, True]))
else:
    HEAD_DIM_CASES = [(d, t, (n + m) % 2 == 1) for n, d in enumerate(HEAD_DIMS)
                      for m, t in enumerate(DTYPES)]


@pytest.mark.parametrize("d,dtype,causal", HEAD_DIM_CASES,
                         ids=[f"d{d}-{dtype_id(t)}-{'causal' if c else 'full'}"
                              for d, t, c in HEAD_DIM_CASES])
def test_head_dims(device, d, dtype, causal):
    q, k, v = qkv(2, 33, 47, 2, 1, d, dtype)
    check_forward(device, q, k, v, flash_call(causal=causal), dict(causal=causal))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_dtypes(device, dtype, causal):
    q, k, v = qkv(2, 65, 80, 4, 4, 64, dtype)
    check_forward(device, q, k, v, flash_call(causal=causal), dict(causal=causal))


# (Hq, Hk): plain, GQA 2 and 4, MQA.
HEADS = [(4, 4), (4, 2), (8, 2), (6, 1)]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("hq,hk", HEADS, ids=[f"hq{a}-hk{b}" for a, b in HEADS])
@pytest.mark.parametrize("dtype", DTYPES if FULL else [torch.float16], ids=dtype_id)
def test_gqa_mqa(device, dtype, hq, hk, causal):
    q, k, v = qkv(2, 37, 29, hq, hk, 32, dtype)
    check_forward(device, q, k, v, flash_call(causal=causal), dict(causal=causal))


# (Sq, Sk, window, causal).  Some rows see nothing: (60, 20, (2, 1)) has off = -40, so
# query i sees keys [i - 42, i - 39] and rows 0..38 none.
WINDOWS = [
    (48, 48, (8, 8), False),
    (33, 65, (16, -1), False),
    (65, 33, (-1, 7), False),
    (40, 70, (5, -1), True),
    (60, 20, (2, 1), False),
    (20, 60, (0, 0), False),
    (50, 50, (0, -1), False),
]


@pytest.mark.parametrize("sq,sk,window,causal", WINDOWS,
                         ids=[f"sq{a}-sk{b}-w{w[0]}_{w[1]}{'-causal' if c else ''}"
                              for a, b, w, c in WINDOWS])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=dtype_id)
def test_sliding_window(device, dtype, sq, sk, window, causal):
    q, k, v = qkv(2, sq, sk, 2, 1, 32, dtype)
    opts = dict(window_size=window, causal=causal)
    check_forward(device, q, k, v, flash_call(**opts), opts)


# D = 96 and 128 have a separate CUDA forward instance for softcap and ALiBi (kFwdPlain in
# csrc/cuda_fmha/configs.h); the other head dims run both kinds of problem in one.
@pytest.mark.parametrize("d", [64, 96, 128])
@pytest.mark.parametrize("softcap", [2.0, 30.0])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_softcap(device, softcap, causal, d):
    # Inputs scaled by 4 so the scores reach the softcap's nonlinear range.
    q, k, v = qkv(2, 41, 57, 4, 2, d, torch.float16, scale=4.0)
    opts = dict(softcap=softcap, causal=causal)
    check_forward(device, q, k, v, flash_call(**opts), opts)


@pytest.mark.parametrize("d", [32, 96, 128])
@pytest.mark.parametrize("per_batch", [False, True], ids=["slopes_h", "slopes_bh"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_alibi(device, per_batch, causal, d):
    B, hq = 2, 4
    q, k, v = qkv(B, 30, 45, hq, 2, d, torch.bfloat16 if d == 128 else torch.float16)
    slopes = torch.rand(B, hq) if per_batch else torch.rand(hq)
    opts = dict(alibi_slopes=slopes, causal=causal)
    check_forward(device, q, k, v, flash_call(**opts), opts)


def test_softmax_scale(device):
    q, k, v = qkv(2, 31, 31, 2, 2, 64, torch.float32)
    opts = dict(softmax_scale=0.37, causal=True)
    check_forward(device, q, k, v, flash_call(**opts), opts)


# Top-left alignment (torch's is_causal): off = 0, including the ALiBi distance.
TOP_LEFT = [
    (33, 65, dict(causal=True)),
    (65, 33, dict(causal=True)),
    (40, 60, dict(window_size=(5, 3))),
    (50, 30, dict(causal=True, alibi_slopes="h")),
]


@pytest.mark.parametrize("sq,sk,opts", TOP_LEFT,
                         ids=[f"sq{a}-sk{b}-" + "-".join(o) for a, b, o in TOP_LEFT])
def test_top_left_alignment(device, sq, sk, opts):
    q, k, v = qkv(2, sq, sk, 2, 2, 32, torch.float32)
    opts = dict(opts)
    if opts.get("alibi_slopes") == "h":
        opts["alibi_slopes"] = torch.rand(2)
    check_forward(device, q, k, v, op_call(top_left=True, **opts), dict(top_left=True, **opts))


@pytest.mark.parametrize("B,sq,sk", [(2, 5, 0), (2, 0, 5), (0, 5, 5)],
                         ids=["no_keys", "no_queries", "no_batch"])
def test_empty_sequences(device, B, sq, sk):
    # Sk == 0: every row sees nothing (out 0, LSE -inf); Sq == 0 or B == 0: empty outputs.
    q, k, v = qkv(B, sq, sk, 2, 2, 16, torch.float16)
    check_forward(device, q, k, v, flash_call(causal=True), dict(causal=True))


@pytest.mark.parametrize("opts", [dict(causal=True), dict(window_size=(700, 30))], ids=["causal", "window"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=dtype_id)
def test_keys_in_several_cpu_chunks(device, dtype, opts):
    # Where a query block sees more keys than fit L2, the CPU forward's work items take them
    # a chunk at a time, each block's softmax state kept between chunks (fwd_blocks_chunked,
    # csrc/cpu/tiles.inc; 128 keys at head dim 256): 1200 keys are ten chunks, the last
    # partial, a window ends inside one, and 100 rows are four blocks.  bf16 on a CPU with
    # AMX takes the AMX kernel's chunks (fwd_blocks_amx_chunked, csrc/cpu/amx.inc; 1024 keys
    # at head dim 256): two under the causal mask, the second partial.
    q, k, v = qkv(1, 100, 1200, 4, 2, 256, dtype)
    check_forward(device, q, k, v, flash_call(**opts), opts)


@pytest.mark.parametrize("dtype,causal", [(torch.float16, True), (torch.float32, False)],
                         ids=["fp16-causal", "fp32-full"])
def test_long_sequence(device, dtype, causal):
    q, k, v = qkv(1, 1024, 1024, 2, 1, 32, dtype)
    check_forward(device, q, k, v, flash_call(causal=causal), dict(causal=causal))


# D = 64 (and head dims padded to it) switches to a second key block on CUDA from 512 keys
# without a mask and 1024 with one (kFwdLongKeys, csrc/cuda_fmha/configs.h): both sides of
# both switches, lengths off both block sizes, GQA.
@pytest.mark.parametrize("sk", [511, 512, 600, 1023, 1024, 1100])
@pytest.mark.parametrize("d", [40, 64])
def test_long_key_block(device, d, sk):
    q, k, v = qkv(1, 200, sk, 4, 2, d, torch.bfloat16)
    for causal in (False, True):
        check_forward(device, q, k, v, flash_call(causal=causal), dict(causal=causal))


# The CUDA forward visits the last key block first and, where the block width divides in
# three (48 keys at D = 96 and 128, 96 at D = 64 from 512 keys), computes only the live
# third or two thirds of it (fwd_kernel.h).  Lengths with 16, 17, 32, 33 and 48 live keys
# in that block; causal and windowed masks move the block's end per query tile.
@pytest.mark.parametrize("sk", [112, 113, 128, 129, 144])
@pytest.mark.parametrize("d", [96, 128])
def test_partial_first_key_block(device, d, sk):
    q, k, v = qkv(1, 150, sk, 4, 2, d, torch.bfloat16)
    for options in (dict(), dict(causal=True), dict(window_size=(40, 7))):
        check_forward(device, q, k, v, flash_call(**options), options)


@pytest.mark.parametrize("magnitude", [30.0, 300.0])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_large_magnitude(device, dtype, magnitude):
    # Scores of size ~magnitude: softmax is near one-hot and exp would overflow without
    # the max shift.  For fp32 inputs the fp32 score error grows with |s| (~|s| * 6e-8 in
    # every exponent: ~2e-5 at |s| ~ 300), so fp32 gets 10x its usual limit; fp16/bf16
    # limits are dominated by output rounding and stay as they are.
    q, k, v = qkv(2, 40, 40, 2, 2, 64, dtype, scale=magnitude)
    tol = OUT_TOL[dtype] * (10 if dtype == torch.float32 else 1)
    res = check_forward(device, q, k, v, flash_call(causal=True), dict(causal=True), out_tol=tol,
                        lse_tol=10 * tol if dtype == torch.float32 else None)
    assert_all_finite(res["out"], "out")


STRIDED = {
    # (B, S, H, D) views of (B, H, S, D) storage: SDPA's layout.
    "bhsd_transposed": lambda q, k, v: [x.transpose(1, 2).contiguous().transpose(1, 2)
                                        for x in (q, k, v)],
    # Slices of one (B, S, 3, H, D) tensor: the qkvpacked layout.
    "packed_qkv_slices": lambda q, k, v: torch.stack([q, k, v], dim=2).unbind(2),
    # Rows padded to a larger stride.
    "padded_rows": lambda q, k, v: [F.pad(x, (0, 8))[..., :x.shape[-1]] for x in (q, k, v)],
    # Head dimension not contiguous: flash-attn copies such inputs, and so must fmha.
    "strided_head_dim": lambda q, k, v: [torch.stack([x, x], -1)[..., 0] for x in (q, k, v)],
}


@pytest.mark.parametrize("layout", list(STRIDED))
def test_strided_inputs(device, layout):
    # Batch/row/head strides are free (and a strided head dim is copied).  The strided
    # views are made on the device, since .to() may compact them.
    q, k, v = qkv(2, 37, 37, 4, 4, 32, torch.float16)

    def call(q, k, v):
        q, k, v = STRIDED[layout](q, k, v)
        assert not q.is_contiguous() and not k.is_contiguous()
        return flash_call(causal=True)(q, k, v)

    check_forward(device, q, k, v, call, dict(causal=True))


if FULL:
    # FMHA_TEST_FULL=1: head dim x lengths x causal x dtype x heads, crossed.
    SWEEP = list(itertools.product([32, 64, 128, 256], [(1, 1), (113, 203), (256, 256), (255, 17)],
                                   [False, True], DTYPES, [(4, 4), (4, 1)]))

    @pytest.mark.parametrize("d,seqlens,causal,dtype,heads", SWEEP,
                             ids=[f"d{d}-sq{s[0]}-sk{s[1]}-{'causal' if c else 'full'}-"
                                  f"{dtype_id(t)}-hq{h[0]}-hk{h[1]}" for d, s, c, t, h in SWEEP])
    def test_full_sweep(device, d, seqlens, causal, dtype, heads):
        q, k, v = qkv(2, *seqlens, *heads, d, dtype)
        check_forward(device, q, k, v, flash_call(causal=causal), dict(causal=causal))


def test_window_size_any_pair_of_integers(device):
    # flash-attn takes any pair of integers: a list, numpy integers and arrays, an integer
    # tensor; all mean the same as the tuple.
    import numpy as np
    q, k, v = (randn(1, 40, 2, 32, device=device) for _ in range(3))
    want = fmha.flash_attn_func(q, k, v, window_size=(7, 3))
    for w in ([7, 3], (np.int64(7), np.int32(3)), np.array([7, 3]), torch.tensor([7, 3]),
              torch.tensor([7, 3], dtype=torch.int32)):
        assert torch.equal(fmha.flash_attn_func(q, k, v, window_size=w), want), f"window_size={w!r}"


# The CPU forward computes neighbouring 32-row blocks that see the same keys of a key tile in
# one pass over its rows (on AVX-512); a row's result must not depend on that: each slice of
# query rows alone (one block, nothing to pair with) gives the rows of the whole call bit for
# bit.  Non-causal (a slice's rows keep their keys: masks aligned bottom-right would move),
# with softcap, GQA, and key counts that end mid-tile, past the forward's key chunks
# (D = 128: 256 keys), and of one tile (D = 64, 60 keys).
@pytest.mark.parametrize("d,sk,opts", [(128, 600, {}), (64, 60, {}), (64, 300, dict(softcap=5.0)),
                                       (256, 130, {})],
                         ids=["d128-sk600", "d64-sk60", "d64-sk300-softcap", "d256-sk130"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=dtype_id)
def test_cpu_rows_independent_of_blocking(d, sk, opts, dtype):
    q = randn(2, 150, 4, d, dtype=dtype)
    k, v = randn(2, sk, 2, d, dtype=dtype), randn(2, sk, 2, d, dtype=dtype)
    out, lse, _ = fmha.flash_attn_func(q, k, v, return_attn_probs=True, **opts)
    for i0, i1 in [(0, 32), (32, 64), (64, 96), (100, 150), (149, 150)]:
        part, part_lse, _ = fmha.flash_attn_func(q[:, i0:i1], k, v, return_attn_probs=True, **opts)
        assert torch.equal(part, out[:, i0:i1]), f"rows {i0}..{i1} differ from the whole call's"
        assert torch.equal(part_lse, lse[:, :, i0:i1]), f"LSE of rows {i0}..{i1} differs"


# fp16 rows reach the CPU kernels and leave them through the backend's row conversions (F16C
# on x86, element by element on the generic path, which test_cpu_paths.py runs): values at the
# ends of fp16's range must pass both ways unchanged.  With q = 0 every key weighs the same,
# and 64 equal value rows average to themselves exactly (fp32 sums of up to 64 equal fp16
# values and a product by 1/64 are exact), so out must equal the value row bit for bit.  D = 44
# leaves a tail that the 8-wide conversions do not cover.
def test_cpu_fp16_rows_convert_exactly():
    vals = torch.tensor([65504.0, -65504.0, 2.0 ** -14, 2.0 ** -24, -(2.0 ** -24), 2.0 ** -15 * 3, 1.0, -2.5,
                         0.0, 1000.5, 0.1, -0.333, 2.0 ** -20 * 5, 60000.0], dtype=torch.float32).half()
    D = 44
    row = vals.repeat(4)[:D]
    q = torch.zeros(1, 3, 2, D, dtype=torch.float16)
    k = randn(1, 64, 2, D, dtype=torch.float16)
    v = row.expand(1, 64, 2, D).contiguous()
    out = fmha.flash_attn_func(q, k, v)
    want = row.expand(1, 3, 2, D)
    assert torch.equal(out.view(torch.int16), want.contiguous().view(torch.int16)), \
        f"fp16 values changed on their way through the CPU kernels: {out[0, 0, 0]} against {row}"
