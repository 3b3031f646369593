"""The sm_90a forward and backward (wgmma, TMA) on Hopper GPUs (test names carry "cuda" so
that the GPU half, `-k cuda`, selects them): which calls they take, that forcing the
mma.sync kernels (FMHA_FORCE_MMA_SYNC=1) gives the same answer, and the backward's features
at the head dims it runs (most of test_backward.py runs at D = 32, on mma.sync).  Every other GPU test runs on
whichever path the dispatch picks, so on an H200 the suite checks the sm_90a kernel; run it
once more with FMHA_FORCE_MMA_SYNC=1 to check the mma.sync kernels there (tools/gpu_check.sh
does both)."""

import itertools

import pytest
import torch

import fmha
from fmha import _C
from conftest import (GRAD_TOL, OUT_TOL, assert_close, assert_lse_close, check_backward, flash_call, kernels_launched,
                      leaf, op_call, poison_memory, poisoned_outputs, randn, varlen_call)
from reference import attention_ref, attention_ref_grads


def _hopper_build():
    """An sm_90 GPU, and CUDA kernels compiled for it (FMHA_CUDA_ARCHS with 90: sm_90a)."""
    if torch.version.hip or not torch.cuda.is_available() or torch.cuda.get_device_capability(0) != (9, 0):
        return False
    caps = _C.capabilities(_C.Device.cuda)
    return caps["available"] and bool({"90", "90a"} & set(caps["archs"].split(",")))


pytestmark = pytest.mark.skipif(not _hopper_build(), reason="needs an sm_90 GPU and a build with sm_90a kernels")


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

    (out, lse), names = kernels_launched(call)
    assert _ran_sm90(names), f"the sm_90a forward did not run: {sorted(names)}"
    (out_mma, lse_mma), names_mma = kernels_launched(call, force_mma_sync=True)
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
    _, names = kernels_launched(fn)
    assert names and not _ran_sm90(names), sorted(names)


# The plain instances fold the scale into their exp2s without a test, so a scale <= 0 must
# take the score-mod instance (dispatch.cu); and the key loop runs the blocks that need a mask
# (the diagonal, the end of the keys, a window's left edge) apart from those that need none:
# windows whose masked blocks come first and last, and a band narrower than a block.
SCALE_AND_MASK_RUNS = {
    "negative_scale": dict(softmax_scale=-0.2),
    "zero_scale": dict(softmax_scale=0.0),
    "negative_scale_causal": dict(softmax_scale=-0.1, causal=True),
    "window_both_edges": dict(window_size=(300, 100)),
    "window_narrow": dict(window_size=(20, 20)),
    "causal_window": dict(causal=True, window_size=(400, 0)),
}


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("case", list(SCALE_AND_MASK_RUNS))
def test_cuda_sm90_forward_scale_and_mask_runs(case, d):
    kw = SCALE_AND_MASK_RUNS[case]
    q = torch.randn(2, 700, 4, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 1100, 2, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(2, 1100, 2, d, device="cuda", dtype=torch.bfloat16)
    with poisoned_outputs():
        (out, lse), names = kernels_launched(lambda: fmha.flash_attn_func(q, k, v, return_attn_probs=True, **kw)[:2])
    assert _ran_sm90(names), f"the sm_90a forward did not run: {sorted(names)}"
    ref_out, ref_lse = attention_ref(q.cpu(), k.cpu(), v.cpu(), **kw)
    assert_close(out, ref_out, OUT_TOL[torch.bfloat16], "out")
    assert_close(lse, ref_lse, 1e-4, "lse")


# The tile by the keys a tile sees (seqlen_k, half of it under a mask; FwdSm90Tile's kLongKeys,
# kMLong and kNLong): D = 128 keeps 128-key blocks at every length (8300 % 128 = 108 live
# keys in the last); from 2048, D = 64 192-row tiles of three consumers (300 rows: a second tile of
# 108; 2100 % 128 = 52 live keys in the last block) and 128-row tiles below (2000 keys),
# with and without softcap (the score-mod instance); from 4096, D = 192 takes 112-key blocks
# (4200 % 112 = 56) and 96-key blocks below (4000 % 96 = 64); D = 256 takes 80-key blocks
# from 1024 (1100 % 80 = 60 live keys in the last) and 64-key blocks below (1000 % 64 = 40).
TILES = {"d64": (64, 0.0, 2100, "64, 192, 128"), "d64_softcap": (64, 20.0, 2100, "64, 192, 128"),
         "d64_short": (64, 0.0, 2000, "64, 128, 128"),
         "d128": (128, 0.0, 8300, "128, 128, 128"), "d192": (192, 0.0, 4200, "192, 128, 112"),
         "d192_softcap": (192, 20.0, 4200, "192, 128, 112"), "d192_short": (192, 0.0, 4000, "192, 128, 96"),
         "d256": (256, 0.0, 1100, "256, 128, 80"),
         "d256_softcap": (256, 20.0, 1100, "256, 128, 80"), "d256_short": (256, 0.0, 1000, "256, 128, 64")}


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", list(TILES))
def test_cuda_sm90_long_tiles(causal, case):
    d, softcap, keys, tile = TILES[case]
    sk = 2 * keys if causal else keys
    q = torch.randn(1, 300, 4, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, sk, 2, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(1, sk, 2, d, device="cuda", dtype=torch.bfloat16)
    (out, lse), names = kernels_launched(
        lambda: fmha.flash_attn_func(q, k, v, causal=causal, softcap=softcap, return_attn_probs=True)[:2])
    assert any("fwd_sm90_kernel" in n and tile in n for n in names), sorted(names)
    ref_out, ref_lse = attention_ref(q.cpu(), k.cpu(), v.cpu(), causal=causal, softcap=softcap)
    assert_close(out, ref_out, OUT_TOL[torch.bfloat16], "out")
    assert_close(lse, ref_lse, 1e-4, "lse")


# A window on the long tiles (D = 64's 192-row tiles from 2 x 2048 keys under a mask): runs
# of masked blocks at both ends of every tile's keys (the window's left edge; its right edge
# past the last key for the last rows) around unmasked ones, 4200 % 192 = 168 live rows in the
# last tile and 4200 % 128 = 104 live keys in the last block.
def test_cuda_sm90_long_tiles_window():
    q, k, v = (torch.randn(1, 4200, 2, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    kw = dict(window_size=(700, 300))
    (out, lse), names = kernels_launched(lambda: fmha.flash_attn_func(q, k, v, return_attn_probs=True, **kw)[:2])
    assert any("fwd_sm90_kernel" in n and "64, 192, 128" in n for n in names), sorted(names)
    ref_out, ref_lse = attention_ref(q.cpu(), k.cpu(), v.cpu(), **kw)
    assert_close(out, ref_out, OUT_TOL[torch.bfloat16], "out")
    assert_close(lse, ref_lse, 1e-4, "lse")


# Under a causal mask a consumer's 64 rows may end a key block or more before its tile's
# (fwd_sm90_kernel.h, kSkipBlocks): it skips the tile's leading blocks.  Square masks at every
# head dim (4200: D = 64's 192-row tiles, D = 256's 80-key blocks; 1000: D = 256's 64-key and
# D = 192's 96-key blocks), more queries than keys (the top rows see no key, whole consumers
# none), and varlen sequences with an empty one, whose diagonals sit at other offsets in their
# tiles; outputs poisoned.
CAUSAL_FIRST_BLOCKS = {"square": (1000, 1000), "square_long": (4200, 4200), "more_queries": (700, 300)}


@pytest.mark.parametrize("d", [64, 96, 128, 192, 256])
@pytest.mark.parametrize("case", list(CAUSAL_FIRST_BLOCKS) + ["varlen"])
def test_cuda_sm90_forward_causal_first_blocks(case, d):
    if case == "varlen":
        lens = [300, 0, 1200, 130, 777]
        cu = torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32)
        q, k, v = (torch.randn(cu[-1].item(), 4, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        call = varlen_call(cu, cu, max(lens), max(lens), causal=True)
        with poisoned_outputs():
            (out, lse), names = kernels_launched(lambda: call(q, k, v))
        ref_out, ref_lse = attention_ref(q.cpu(), k.cpu(), v.cpu(), cu_seqlens_q=cu, cu_seqlens_k=cu, causal=True)
    else:
        sq, sk = CAUSAL_FIRST_BLOCKS[case]
        q = torch.randn(1, sq, 2, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(1, sk, 2, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(1, sk, 2, d, device="cuda", dtype=torch.bfloat16)
        with poisoned_outputs():
            (out, lse), names = kernels_launched(
                lambda: fmha.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)[:2])
        ref_out, ref_lse = attention_ref(q.cpu(), k.cpu(), v.cpu(), causal=True)
    assert _ran_sm90(names), f"the sm_90a forward did not run: {sorted(names)}"
    assert_close(out, ref_out, OUT_TOL[torch.bfloat16], "out")
    assert_lse_close(lse, ref_lse, 1e-4)


# The sorted tail (tile_order.h, FwdSm90Traits::kSortedTail) at D = 64's 192-row tiles,
# under a causal mask (also with softcap: the score-mod instance) or a right-bounded window:
# 2 sequences of 64 query heads (GQA over 8)
# and 4400 rows make 23 tiles a head (odd: every head's middle tile goes to the tail) and 1472
# pairs, so whole rounds of pairs come first on any GPU of up to 490 SMs, then the tail, one
# tile at a time across the CTAs.  Outputs poisoned; every head against the mma.sync path,
# the first and last heads of each sequence (pairs, tail) against the float64 reference.
@pytest.mark.parametrize("mask", ["causal", "window", "causal_softcap"])
def test_cuda_sm90_forward_sorted_tail(mask):
    q = torch.randn(2, 4400, 64, 64, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(2, 4400, 8, 64, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    kw = {"causal": dict(causal=True), "window": dict(window_size=(3000, 5)),
          "causal_softcap": dict(causal=True, softcap=20.0)}[mask]
    call = lambda: fmha.flash_attn_func(q, k, v, return_attn_probs=True, **kw)[:2]  # noqa: E731
    with poisoned_outputs():
        (out, lse), names = kernels_launched(call)
    assert any("fwd_sm90_kernel" in n and "64, 192, 128" in n for n in names), sorted(names)
    (mma_out, mma_lse), _ = kernels_launched(call, force_mma_sync=True)
    assert_close(out, mma_out, OUT_TOL[torch.bfloat16], "out against mma.sync")
    assert_lse_close(lse, mma_lse, 1e-4)
    heads = [0, 31, 63]
    for b in range(2):
        sub = lambda t, idx: t[b:b + 1, :, idx].cpu()  # noqa: E731
        ref_out, ref_lse = attention_ref(sub(q, heads), sub(k, [h // 8 for h in heads]), sub(v, [h // 8 for h in heads]), **kw)
        assert_close(out[b:b + 1, :, heads], ref_out, OUT_TOL[torch.bfloat16], f"out, sequence {b}")
        assert_lse_close(lse[b:b + 1, heads], ref_lse, 1e-4)


# Row maxima that rise from key block to key block (kLazyRescale, fwd_sm90_kernel.h): O and l
# are rescaled only where a block's maximum passes the running one by more than 8 in log2
# units, and P stays below 2^8 meanwhile.  Scores fall by `step` per key and the kernel walks
# the blocks from the last key to the first, so each block's maximum is the highest yet:
# by 2.56 a 128-key block at 0.02 (3.7 in log2 units: the maximum moves every third block
# or so) and by 12.8 at 0.1 (every block).  One shared direction of q and k sets the step;
# the reference sees the same rounded inputs.
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("d", [64, 96, 128, 192, 256])
@pytest.mark.parametrize("step", [0.02, 0.1], ids=["slow", "fast"])
def test_cuda_sm90_forward_rising_maxima(step, d, dtype):
    sk = 1000
    q = torch.randn(2, 300, 4, d, device="cuda", dtype=dtype) * 0.1
    k = torch.randn(2, sk, 2, d, device="cuda", dtype=dtype) * 0.1
    v = torch.randn(2, sk, 2, d, device="cuda", dtype=dtype)
    q[..., 0] = 1.0
    k[..., 0] = (step * torch.arange(sk - 1, -1, -1, device="cuda", dtype=torch.float32)).to(dtype)[None, :, None]
    with poisoned_outputs():
        (out, lse), names = kernels_launched(
            lambda: fmha.flash_attn_func(q, k, v, softmax_scale=1.0, return_attn_probs=True)[:2])
    assert _ran_sm90(names), f"the sm_90a forward did not run: {sorted(names)}"
    ref_out, ref_lse = attention_ref(q.cpu(), k.cpu(), v.cpu(), softmax_scale=1.0)
    assert_close(out, ref_out, OUT_TOL[dtype], "out")
    assert_close(lse, ref_lse, 1e-4, "lse")


# ---------------------------------------------------------------- backward


def _ran_sm90_bwd(names):
    return any("bwd_sm90_kernel" in n for n in names)


def _qkv(B, sq, sk, hq, hk, d, dtype=torch.bfloat16, scale=1.0):
    return (randn(B, sq, hq, d, dtype=dtype, scale=scale), randn(B, sk, hk, d, dtype=dtype),
            randn(B, sk, hk, d, dtype=dtype))


def _check_sm90_backward(q, k, v, call, ref_kwargs):
    """check_backward (float64 reference, poisoned outputs, CPU backend) with the sm_90a
    backward asserted to have run."""
    res, names = kernels_launched(lambda: check_backward("cuda", q, k, v, call, ref_kwargs))
    assert _ran_sm90_bwd(names), f"the sm_90a backward did not run: {sorted(names)}"
    return res


# Head dims 33-256 run on it (padded to 64, 128, 192, 256, with 65-96 on the 128 kernel; above
# 128 the consumers split the head dim); 333 queries and 517 keys are no multiple of the
# 64-row query blocks or the 64- and 128-key blocks; GQA 8:2.
@pytest.mark.parametrize("d", [40, 64, 72, 96, 104, 128, 160, 192, 200, 256])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_cuda_sm90_backward_head_dims(d, dtype):
    q, k, v = _qkv(2, 333, 517, 8, 2, d, dtype)
    _check_sm90_backward(q, k, v, flash_call(causal=True), dict(causal=True))


_SLOPES = torch.rand(2, 4)
BWD_FEATURES = {
    "full": (300, 200, flash_call(), {}),
    "window": (260, 300, flash_call(window_size=(50, 10)), dict(window_size=(50, 10))),
    "causal_rows_see_nothing": (300, 100, flash_call(causal=True), dict(causal=True)),
    "top_left_causal_sq_gt_sk": (300, 150, op_call(top_left=True, causal=True), dict(top_left=True, causal=True)),
    "top_left_causal_sq_lt_sk": (150, 300, op_call(top_left=True, causal=True), dict(top_left=True, causal=True)),
    "top_left_window": (200, 260, op_call(top_left=True, window_size=(40, 7)), dict(top_left=True, window_size=(40, 7))),
    "softcap": (200, 230, flash_call(softcap=5.0, causal=True), dict(softcap=5.0, causal=True)),
    "alibi": (200, 230, flash_call(alibi_slopes=_SLOPES, causal=True), dict(alibi_slopes=_SLOPES, causal=True)),
    "scale": (130, 140, flash_call(softmax_scale=0.37), dict(softmax_scale=0.37)),
}


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("feature", list(BWD_FEATURES))
def test_cuda_sm90_backward_features(feature, d):
    sq, sk, call, ref = BWD_FEATURES[feature]
    q, k, v = _qkv(2, sq, sk, 4, 2, d, scale=4.0 if feature == "softcap" else 1.0)
    res = _check_sm90_backward(q, k, v, call, ref)
    if feature == "causal_rows_see_nothing":
        assert (res["dq"][:, :200] == 0).all()


# The plain D = 64 instance walks a key block's query blocks in runs (kMaskRuns): masked
# blocks first (the diagonal, a window's near edge), then those that see every key of the
# block with the mask compiled out, then masked ones again (a window's far edge, the last,
# partial query block); D = 128 and 192 test every block in one loop.  Windows with blocks
# of all three kinds, a band narrower than a block, bottom-right causal with more keys than
# queries, and no mask (the last query block alone is masked: 60 live rows of 700).
BWD_MASK_RUNS = {
    "full": {},
    "window_both_edges": dict(window_size=(300, 100)),
    "window_narrow": dict(window_size=(20, 20)),
    "causal": dict(causal=True),
    "causal_window": dict(causal=True, window_size=(400, 0)),
}


@pytest.mark.parametrize("d", [64, 128, 192])
@pytest.mark.parametrize("case", list(BWD_MASK_RUNS))
def test_cuda_sm90_backward_mask_runs(case, d):
    kw = BWD_MASK_RUNS[case]
    q, k, v = _qkv(2, 700, 1100, 4, 2, d)
    _check_sm90_backward(q, k, v, flash_call(**kw), kw)


@pytest.mark.parametrize("d", [64, 96, 128, 192, 256])
def test_cuda_sm90_backward_varlen_empty_sequences(d):
    lens_q, lens_k = [0, 70, 1, 133, 0, 300], [5, 0, 64, 200, 0, 260]
    cu_q = torch.tensor([0] + list(itertools.accumulate(lens_q)), dtype=torch.int32)
    cu_k = torch.tensor([0] + list(itertools.accumulate(lens_k)), dtype=torch.int32)
    q = randn(int(cu_q[-1]), 6, d, dtype=torch.bfloat16)
    k, v = (randn(int(cu_k[-1]), 2, d, dtype=torch.bfloat16) for _ in range(2))
    for causal in (False, True):
        _check_sm90_backward(q, k, v, varlen_call(cu_q, cu_k, max(lens_q), max(lens_k), causal=causal),
                             dict(causal=causal, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k))


# More tiles (key block, KV head, sequence) than twice the SMs, in varlen sequences of mixed
# lengths: empty ones, key blocks past a short sequence's end, and under a window key blocks
# that no query block sees, between tiles with work.  A CTA per tile today; the case a
# backward whose CTAs walk several tiles each must get right.
_MANY_TILES_MASKS = {"full": {}, "causal": dict(causal=True), "window": dict(causal=True, window_size=(150, 0))}


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("mask", list(_MANY_TILES_MASKS))
def test_cuda_sm90_backward_many_tiles(mask, d):
    kw = _MANY_TILES_MASKS[mask]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    pattern = [0, 1, 300, 129, 520, 64, 0, 400]
    blocks = -(-max(pattern) // (64 if d > 128 else 128))
    lens = pattern * -(-(2 * sms + 1) // (len(pattern) * blocks))
    cu = torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32)
    q = randn(int(cu[-1]), 2, d, dtype=torch.bfloat16)
    k, v = (randn(int(cu[-1]), 1, d, dtype=torch.bfloat16) for _ in range(2))
    _check_sm90_backward(q, k, v, varlen_call(cu, cu, max(lens), max(lens), **kw),
                         dict(cu_seqlens_q=cu, cu_seqlens_k=cu, **kw))


def test_cuda_sm90_backward_long_sequence():
    q, k, v = _qkv(1, 2100, 2100, 2, 1, 128)
    _check_sm90_backward(q, k, v, flash_call(causal=True), dict(causal=True))


# Few CTAs (here every GQA test above): the group's query heads are shared by several CTAs
# whose fp32 dK/dV shares dkv_reduce_kernel sums; enough CTAs (at least two per SM): one
# CTA walks the whole group and sums it in registers.
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("split", [True, False], ids=["split", "whole"])
def test_cuda_sm90_backward_gqa_group_split(d, split):
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    block_n = 64 if d > 128 else 128
    sk = 1100 if d <= 128 else 700
    batch = 1 if split else -(-2 * sms // ((-(-sk // block_n)) * 4))
    q, k, v = _qkv(batch, 900, sk, 16, 4, d)
    res, names = kernels_launched(lambda: check_backward("cuda", q, k, v, flash_call(causal=True), dict(causal=True)))
    assert _ran_sm90_bwd(names), sorted(names)
    assert any("dkv_reduce_kernel" in n for n in names) == split, sorted(names)


# Deterministic mode adds each query block's dQ from its key blocks in a fixed order (turn
# counters, bwd_sm90_kernel.h).  Cases with many key blocks per query block (full: 9 at
# D <= 128, 18 at 256), a window (two or three), causal with fewer queries than keys, and
# varlen with empty sequences; all but `full` have GQA groups split over CTAs
# (bwd_sm90_splits, few CTAs).  Three runs bitwise the same, no other dQ kernel, and the
# gradients close to the reference.
_DETERMINISTIC_CASES = {
    # name: (B, sq, sk, Hq, Hk, options)
    "full": (1, 200, 1100, 4, 4, dict()),
    "window": (2, 300, 340, 8, 2, dict(causal=True, window_size=(90, -1))),
    "causal": (1, 900, 1100, 16, 4, dict(causal=True)),
    "varlen": (None, None, None, 4, 2, dict(causal=True)),
}


@pytest.mark.parametrize("case", list(_DETERMINISTIC_CASES))
@pytest.mark.parametrize("d", [64, 96, 128, 256])
def test_cuda_sm90_backward_deterministic(d, case):
    B, sq, sk, hq, hk, opts = _DETERMINISTIC_CASES[case]
    opts = dict(opts, deterministic=True)
    ref = {n: v for n, v in opts.items() if n != "deterministic"}
    if case == "varlen":
        lens = [0, 700, 1, 333, 0, 900]
        cu = torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32)
        total = int(cu[-1])
        q, k, v = (randn(total, h, d, dtype=torch.bfloat16) for h in (hq, hk, hk))
        call = varlen_call(cu, cu, max(lens), max(lens), **opts)
        ref.update(cu_seqlens_q=cu, cu_seqlens_k=cu)
    else:
        q, k, v = _qkv(B, sq, sk, hq, hk, d)
        call = flash_call(**opts)
    dout = randn(*q.shape, dtype=torch.bfloat16)

    def grads():
        leaves = [leaf(t.cuda()) for t in (q, k, v)]
        with poisoned_outputs():
            call(*leaves)[0].backward(dout.cuda())
        return [t.grad.clone() for t in leaves]

    first, names = kernels_launched(grads)
    assert _ran_sm90_bwd(names) and any("dq_convert_kernel" in n for n in names), sorted(names)
    assert not any("bwd_dq_kernel" in n for n in names), sorted(names)
    assert any("dkv_reduce_kernel" in n for n in names) == (case != "full"), sorted(names)
    for _ in range(2):
        poison_memory(*first)
        again, _ = kernels_launched(grads)
        for name, a, b in zip(("dq", "dk", "dv"), first, again):
            assert torch.equal(a, b), f"{name} differs between two runs of the deterministic backward"
    _check_sm90_backward(q, k, v, call, ref)


@pytest.mark.parametrize("case", ["dropout", "seqused_k", "head_dim_32", "fp32"])
def test_cuda_calls_the_sm90_backward_does_not_take(case):
    # They run on the mma.sync backward, with the same meaning (checked by the rest of the
    # suite).
    dtype = torch.float32 if case == "fp32" else torch.bfloat16
    d = 32 if case == "head_dim_32" else 64
    q, k, v = (leaf(torch.randn(1, 100, 2, d, device="cuda", dtype=dtype)) for _ in range(3))

    def run():
        if case == "seqused_k":
            cu = torch.tensor([0, 100], dtype=torch.int32, device="cuda")
            used = torch.tensor([60], dtype=torch.int32, device="cuda")
            out = fmha.flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, 100, 100, seqused_k=used)
        else:
            out = fmha.flash_attn_func(q, k, v, dropout_p=0.1 if case == "dropout" else 0.0)
        out.sum().backward()

    _, names = kernels_launched(run)
    assert any("bwd" in n for n in names) and not _ran_sm90_bwd(names), sorted(names)


def test_cuda_sm90_backward_declined_after_delta():
    # K and V expanded over the batch (a zero batch stride, which a tensor map cannot hold):
    # the sm_90a backward takes the call by its problem, so D is first written in its padded
    # statistics' layout, and declines it at launch; the mma.sync kernels then need D again
    # in the LSE's layout (dispatch.cu, bwd_tensor_core).
    q = leaf(randn(3, 333, 4, 64, dtype=torch.bfloat16).cuda())
    k1, v1 = (leaf(randn(1, 517, 2, 64, dtype=torch.bfloat16).cuda()) for _ in range(2))
    dout = randn(3, 333, 4, 64, dtype=torch.bfloat16).cuda()

    def run():
        out = fmha.flash_attn_func(q, k1.expand(3, -1, -1, -1), v1.expand(3, -1, -1, -1), causal=True)
        out.backward(dout)
        return out

    with poisoned_outputs():
        out, names = kernels_launched(run)
    assert any("bwd_delta_kernel" in n for n in names) and not _ran_sm90_bwd(names), sorted(names)
    k, v = (t.detach().expand(3, -1, -1, -1).cpu() for t in (k1, v1))
    ref_out, _, dq, dk, dv = attention_ref_grads(q.detach().cpu(), k, v, dout.cpu(), causal=True)
    assert_close(out.cpu(), ref_out, OUT_TOL[torch.bfloat16], "out")
    floor = 1e-2 * max(g.norm().item() for g in (dq, dk, dv))
    assert_close(q.grad.cpu(), dq, GRAD_TOL[torch.bfloat16], "dq", floor=floor)
    assert_close(k1.grad.cpu(), dk.sum(0, keepdim=True), GRAD_TOL[torch.bfloat16], "dk", floor=floor)
    assert_close(v1.grad.cpu(), dv.sum(0, keepdim=True), GRAD_TOL[torch.bfloat16], "dv", floor=floor)
