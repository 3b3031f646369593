"""Paged KV caches in flash_attn_varlen_func (vLLM's call: block_table, seqused_k, no
cu_seqlens_k) and packed queries in flash_attn_with_kvcache (FlashAttention-3's
cu_seqlens_q), against the float64 reference of tests/reference.py built from the keys each
sequence's pages hold: mixed prefill chunks and decode steps, pages of 16, 48 and 256, causal
aligned bottom-right, GQA, windows, softcap, ALiBi, empty sequences (no keys, no query
rows), fp8 and int8 caches, out= (poisoned first), return_softmax_lse; metadata checking
(FMHA_CHECK_METADATA=1); bad input."""

import math

import pytest
import torch

import fmha
from conftest import OUT_TOL, assert_close, assert_lse_close, randn
from reference import attention_ref

LSE_TOL = 1e-4
I32 = torch.int32


def make_batch(seqs, hq, hk, d, page, dtype, extra_pages=3, seed=0):
    """q (total_q, hq, d), paged caches, block_table, cu_seqlens_q, seqused_k for seqs =
    [(rows_q, keys), ...]; pages are shuffled and the table is one column wider than needed
    (filled with a page nobody owns), as a serving engine's is."""
    g = torch.Generator().manual_seed(seed)
    lens_q = [s[0] for s in seqs]
    lens_k = [s[1] for s in seqs]
    per_seq = [max(1, -(-n // page)) for n in lens_k]
    width = max(per_seq) + 1
    num_pages = sum(per_seq) + extra_pages
    order = torch.randperm(num_pages, generator=g).to(I32)
    table = torch.full((len(seqs), width), int(order[-1]), dtype=I32)
    at = 0
    for b, n in enumerate(per_seq):
        table[b, :n] = order[at:at + n]
        at += n
    kc = (torch.randn(num_pages, page, hk, d, generator=g)).to(dtype)
    vc = (torch.randn(num_pages, page, hk, d, generator=g)).to(dtype)
    q = torch.randn(sum(lens_q), hq, d, generator=g).to(dtype)
    cu_q = torch.tensor([0] + lens_q, dtype=I32).cumsum(0).to(I32)
    return q, kc, vc, table, cu_q, torch.tensor(lens_k, dtype=I32)


def gather(cache, table, lens_k, scale=None):
    """(total_k, hk, d) float64 keys of every sequence in order, and cu_seqlens_k; 8-bit
    caches are scaled back (scale: (hk,) per head or (pages, page, hk) per token)."""
    page = cache.shape[1]
    rows = []
    for b, n in enumerate(lens_k.tolist()):
        pos = torch.arange(n)
        pages, offs = table[b, pos // page].long(), pos % page
        if cache.dtype == torch.float8_e4m3fn:  # torch 2.4's CPU indexing has no fp8 kernel: index the bytes
            x = cache.view(torch.uint8)[pages, offs].view(cache.dtype).double()
        else:
            x = cache[pages, offs].double()
        if scale is not None:
            x = x * (scale.double()[None, :, None] if scale.dim() == 1 else scale[pages, offs].double()[..., None])
        rows.append(x)
    cu_k = torch.tensor([0] + lens_k.tolist()).cumsum(0).to(I32)
    return torch.cat(rows), cu_k


def reference(q, kc, vc, table, cu_q, lens_k, k_scale=None, v_scale=None, **kw):
    k, cu_k = gather(kc, table, lens_k, k_scale)
    v, _ = gather(vc, table, lens_k, v_scale)
    return attention_ref(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, **kw)


def on(device, *xs):
    return [None if x is None else x.to(device) for x in xs]


MIXED = [(7, 40), (1, 33), (0, 20), (5, 5), (1, 1), (3, 0), (0, 0), (12, 70)]

CASES = [
    # name, dtype, hq, hk, d, page, seqs, kwargs
    ("mixed-causal-gqa-p16", torch.bfloat16, 8, 2, 64, 16, MIXED, dict(causal=True)),
    ("mixed-window-p48", torch.float16, 4, 4, 32, 48, MIXED, dict(causal=True, window_size=(6, 0))),
    ("softcap-alibi-p256", torch.float16, 4, 2, 64, 256, [(9, 300), (1, 257), (20, 20)],
     dict(causal=True, softcap=5.0, alibi=True)),
    ("noncausal-mqa-p16", torch.float32, 6, 1, 40, 16, [(4, 17), (1, 48), (2, 2)], {}),
    ("window-both-p32", torch.bfloat16, 4, 2, 128, 32, [(10, 90), (1, 31)], dict(window_size=(8, 3))),
    ("decode-only-p16", torch.float16, 8, 8, 64, 16, [(1, n) for n in (1, 15, 16, 17, 64)], dict(causal=True)),
]


@pytest.mark.parametrize("name,dtype,hq,hk,d,page,seqs,kw", CASES, ids=[c[0] for c in CASES])
def test_paged_varlen(device, name, dtype, hq, hk, d, page, seqs, kw):
    q, kc, vc, table, cu_q, lens_k = make_batch(seqs, hq, hk, d, page, dtype)
    kw = dict(kw)
    slopes = torch.rand(hq) * 0.5 if kw.pop("alibi", False) else None
    max_q = max(s[0] for s in seqs)
    out_ref, lse_ref = reference(q, kc, vc, table, cu_q, lens_k, alibi_slopes=slopes, **kw)
    q_, kc_, vc_, table_, cu_q_, lens_k_, slopes_ = on(device, q, kc, vc, table, cu_q, lens_k, slopes)
    out = torch.full_like(q_, math.nan)
    got, lse = fmha.flash_attn_varlen_func(
        q_, kc_, vc_, cu_seqlens_q=cu_q_, max_seqlen_q=max_q, seqused_k=lens_k_, max_seqlen_k=int(lens_k.max()),
        block_table=table_, alibi_slopes=slopes_, out=out, return_softmax_lse=True, **kw)
    assert got is out
    assert lse.shape == (hq, q.shape[0])
    assert_close(got, out_ref, OUT_TOL[dtype], f"{name} out")
    assert_lse_close(lse, lse_ref, LSE_TOL, f"{name} lse")


# Prefill chunks (64 query rows or more in some sequence): on an H200 these run on the sm_90a
# forward reading the pages (fwd_paged_sm90), decode steps mixed in; lengths off every tile
# and page multiple; pages of 16, 32, 48 (copied 16 rows at a time into 128- and 80-key
# blocks, 48 at a time into D = 192's 96-key blocks) and 256 (a whole 128-key block per copy);
# every sm_90a head dim (80 padded to 96; 256 in 80-key blocks), and more than 8192 keys of
# capacity at D = 128, with pages of 256 and of 16 (a block's eight 16-row boxes spread over
# the producer's four warps, the last page cut at the sequence's end); D = 128 without
# softcap or ALiBi runs a 3-stage ring (FwdSm90Tile::kPagedStages), in fp16 as in bf16.
PREFILL = [(130, 700), (1, 300), (0, 90), (70, 70), (1, 1), (64, 0), (200, 333)]
PREFILL_CASES = [
    ("causal-gqa-p16-d128", torch.bfloat16, 8, 2, 128, 16, PREFILL, dict(causal=True)),
    ("causal-p48-d64", torch.float16, 4, 4, 64, 48, PREFILL, dict(causal=True)),
    ("causal-p48-d192", torch.float16, 4, 2, 192, 48, PREFILL, dict(causal=True)),
    ("noncausal-mqa-p256-d96", torch.bfloat16, 4, 1, 96, 256, PREFILL, {}),
    ("window-p16-d80", torch.float16, 4, 2, 80, 16, PREFILL, dict(causal=True, window_size=(100, 0))),
    ("softcap-alibi-p32-d256", torch.bfloat16, 4, 2, 256, 32, [(96, 250), (1, 100), (65, 81)],
     dict(causal=True, softcap=20.0, alibi=True)),
    ("long-p256-d128", torch.bfloat16, 4, 2, 128, 256, [(100, 8500), (64, 300)], {}),
    ("long-p16-d128", torch.bfloat16, 4, 2, 128, 16, [(100, 8500), (64, 300)], {}),
    ("causal-long-p16-d128-fp16", torch.float16, 4, 2, 128, 16, [(300, 3000), (64, 300), (1, 1)], dict(causal=True)),
]


@pytest.mark.parametrize("name,dtype,hq,hk,d,page,seqs,kw", PREFILL_CASES, ids=[c[0] for c in PREFILL_CASES])
def test_paged_prefill(device, name, dtype, hq, hk, d, page, seqs, kw):
    """Chunked prefill over pages.  Cache slots past each sequence's keys (the unfilled rest
    of its last page, and the page nobody owns) hold NaN: the result must not read them."""
    q, kc, vc, table, cu_q, lens_k = make_batch(seqs, hq, hk, d, page, dtype)
    owned = torch.zeros(kc.shape[:2], dtype=torch.bool)
    for b, n in enumerate(lens_k.tolist()):
        pos = torch.arange(n)
        owned[table[b, pos // page].long(), pos % page] = True
    kc[~owned], vc[~owned] = math.nan, math.nan
    kw = dict(kw)
    slopes = torch.rand(hq) * 0.5 if kw.pop("alibi", False) else None
    out_ref, lse_ref = reference(q, kc, vc, table, cu_q, lens_k, alibi_slopes=slopes, **kw)
    q_, kc_, vc_, table_, cu_q_, lens_k_, slopes_ = on(device, q, kc, vc, table, cu_q, lens_k, slopes)
    out = torch.full_like(q_, math.nan)
    got, lse = fmha.flash_attn_varlen_func(
        q_, kc_, vc_, cu_seqlens_q=cu_q_, max_seqlen_q=max(s[0] for s in seqs), seqused_k=lens_k_,
        block_table=table_, alibi_slopes=slopes_, out=out, return_softmax_lse=True, **kw)
    assert got is out
    assert_close(got, out_ref, OUT_TOL[dtype], f"{name} out")
    assert_lse_close(lse, lse_ref, LSE_TOL, f"{name} lse")


def test_paged_prefill_takes_the_sm90_forward(device, monkeypatch):
    """On a compute capability 9.0 GPU the prefill call runs the sm_90a forward, not the
    decode kernels that FMHA_FORCE_MMA_SYNC=1 sends it to: the two sum in different orders,
    so their bits differ (and both match the reference, test_paged_prefill)."""
    if device != "cuda" or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the sm_90a forward runs on compute capability 9.0 GPUs")
    monkeypatch.delenv("FMHA_FORCE_MMA_SYNC", raising=False)  # the suite's forced run
    q, kc, vc, table, cu_q, lens_k = on(device, *make_batch(PREFILL, 8, 2, 128, 16, torch.bfloat16))
    call = lambda: fmha.flash_attn_varlen_func(q, kc, vc, cu_q, None, 200, None, causal=True, block_table=table,
                                               seqused_k=lens_k)
    sm90 = call()
    monkeypatch.setenv("FMHA_FORCE_MMA_SYNC", "1")
    decode = call()
    assert_close(sm90, decode.double(), 2 * OUT_TOL[torch.bfloat16], "sm_90a vs decode kernels")
    assert not torch.equal(sm90, decode), "the prefill call ran the decode kernels"


@pytest.mark.parametrize("num_splits", [0, 1, 3])
def test_paged_varlen_equals_contiguous_varlen(device, num_splits):
    """The paged call computes what flash_attn_varlen_func computes on the same keys laid
    out contiguously (the non-paged kernels), within the tolerance; num_splits any."""
    dtype, seqs = torch.bfloat16, [(6, 64), (1, 200), (17, 17), (1, 5)]
    q, kc, vc, table, cu_q, lens_k = make_batch(seqs, 8, 2, 64, 16, dtype)
    k, cu_k = gather(kc, table, lens_k)
    v, _ = gather(vc, table, lens_k)
    q_, kc_, vc_, table_, cu_q_, lens_k_, k_, v_, cu_k_ = on(device, q, kc, vc, table, cu_q, lens_k, k.to(dtype),
                                                             v.to(dtype), cu_k)
    paged = fmha.flash_attn_varlen_func(q_, kc_, vc_, cu_q_, None, 17, None, causal=True, block_table=table_,
                                        seqused_k=lens_k_, num_splits=num_splits)
    plain = fmha.flash_attn_varlen_func(q_, k_, v_, cu_q_, cu_k_, 17, 200, causal=True)
    assert_close(paged, plain.double(), 2 * OUT_TOL[dtype], "paged vs contiguous")


@pytest.mark.parametrize("qdtype", [torch.float8_e4m3fn, torch.int8], ids=["fp8", "int8"])
@pytest.mark.parametrize("descale", ["scalar", "expanded"])
def test_paged_varlen_8bit_cache(device, qdtype, descale):
    dtype, hk, seqs = torch.float16, 2, [(5, 50), (1, 19), (0, 3), (8, 8)]
    q, kc, vc, table, cu_q, lens_k = make_batch(seqs, 4, hk, 64, 16, dtype)
    kq, ks = fmha.quantize_kv_cache(kc, qdtype)
    vq, vs = fmha.quantize_kv_cache(vc, qdtype)
    out_ref, lse_ref = reference(q, kq, vq, table, cu_q, lens_k, ks, vs, causal=True)
    if descale == "scalar":  # one scale for every head: the per-head scales' max stands in
        ks, vs = ks.max().reshape(1, 1), vs.max().reshape(1, 1)
        out_ref, lse_ref = reference(q, kq, vq, table, cu_q, lens_k, ks.reshape(1).expand(hk),
                                     vs.reshape(1).expand(hk), causal=True)
        k_descale, v_descale = ks, vs
    else:  # vLLM's (batch, nheads_k) view of one row
        k_descale, v_descale = ks, vs
    q_, kq_, vq_, table_, cu_q_, lens_k_, kd_, vd_ = on(device, q, kq, vq, table, cu_q, lens_k, k_descale, v_descale)
    if descale == "expanded":  # expanded where it lives: a copy to the device would give each row its own storage
        kd_, vd_ = kd_[None].expand(len(seqs), hk), vd_[None].expand(len(seqs), hk)
    out, lse = fmha.flash_attn_varlen_func(q_, kq_, vq_, cu_q_, max_seqlen_q=8, seqused_k=lens_k_, causal=True,
                                           block_table=table_, k_descale=kd_, v_descale=vd_, return_softmax_lse=True)
    assert_close(out, out_ref, 4 * OUT_TOL[dtype], "8-bit out")
    assert_lse_close(lse, lse_ref, 1e-3, "8-bit lse")


def test_paged_varlen_cu_seqlens_k_and_gaps(device):
    """seqused_k omitted: the keys per sequence are cu_seqlens_k's differences.  Rows of q
    that no sequence owns (after cu_seqlens_q[-1]) are left as they were in out=."""
    dtype, seqs = torch.float16, [(3, 30), (2, 9)]
    q, kc, vc, table, cu_q, lens_k = make_batch(seqs, 4, 2, 64, 16, dtype)
    q = torch.cat([q, torch.randn(4, 4, 64).to(dtype)])  # 4 trailing rows nobody owns
    cu_k = torch.tensor([0] + lens_k.tolist()).cumsum(0).to(I32)
    out_ref, lse_ref = reference(q, kc, vc, table, cu_q, lens_k, causal=True)
    q_, kc_, vc_, table_, cu_q_, cu_k_ = on(device, q, kc, vc, table, cu_q, cu_k)
    out = torch.full_like(q_, 7.0)
    fmha.flash_attn_varlen_func(q_, kc_, vc_, cu_q_, cu_k_, 3, 30, causal=True, block_table=table_, out=out)
    assert_close(out[:5], out_ref[:5], OUT_TOL[dtype], "owned rows")
    assert (out[5:] == 7.0).all(), "rows outside every sequence were written"


def test_paged_varlen_any_head_dim_padded(device, monkeypatch):
    """A head dim the GPU kernels cannot address directly (40, padded to 48) and a strided
    out=, through the padding path that serves it on the GPU (turned on for the CPU too)."""
    monkeypatch.setattr(fmha.ops, "_vector_rows", lambda dev, dtype: dtype != torch.float32)
    dtype, seqs = torch.bfloat16, [(4, 20), (1, 33)]
    q, kc, vc, table, cu_q, lens_k = make_batch(seqs, 4, 2, 40, 16, dtype)
    out_ref, _ = reference(q, kc, vc, table, cu_q, lens_k, causal=True)
    q_, kc_, vc_, table_, cu_q_, lens_k_ = on(device, q, kc, vc, table, cu_q, lens_k)
    out = torch.full((q.shape[0], 4, 48), math.nan, dtype=dtype, device=device)[..., :40]
    got = fmha.flash_attn_varlen_func(q_, kc_, vc_, cu_q_, max_seqlen_q=4, seqused_k=lens_k_, causal=True,
                                      block_table=table_, out=out)
    assert got is out
    assert_close(out, out_ref, OUT_TOL[dtype], "padded head dim")


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_kvcache_cu_seqlens_q(device, paged):
    """flash_attn_with_kvcache with FlashAttention-3's cu_seqlens_q: packed queries, a
    prefill chunk and decode steps in one call; contiguous and paged caches; per-token
    int8 scales."""
    dtype, hq, hk, d, seqs = torch.bfloat16, 8, 2, 64, [(9, 40), (1, 23), (0, 7), (1, 1), (4, 64)]
    q, kc, vc, table, cu_q, lens_k = make_batch(seqs, hq, hk, d, 16, dtype)
    if not paged:  # the same keys as a contiguous (batch, 64, hk, d) cache
        kc = torch.stack([gather(kc, table[b:b + 1], torch.tensor([64]))[0] for b in range(len(seqs))]).to(dtype)
        vc = torch.stack([gather(vc, table[b:b + 1], torch.tensor([64]))[0] for b in range(len(seqs))]).to(dtype)
        table = None
    out_ref, lse_ref = reference(q, kc.reshape(-1, 16, hk, d) if not paged else kc,
                                 vc.reshape(-1, 16, hk, d) if not paged else vc,
                                 torch.arange(len(seqs) * 4, dtype=I32).reshape(len(seqs), 4) if not paged else table,
                                 cu_q, lens_k, causal=True, window_size=(20, 0))
    q_, kc_, vc_, table_, cu_q_, lens_k_ = on(device, q, kc, vc, table, cu_q, lens_k)
    out, lse = fmha.flash_attn_with_kvcache(q_, kc_, vc_, cache_seqlens=lens_k_, block_table=table_, causal=True,
                                            window_size=(20, 0), return_softmax_lse=True, cu_seqlens_q=cu_q_,
                                            max_seqlen_q=9)
    assert out.shape == q.shape and lse.shape == (hq, q.shape[0])
    assert_close(out, out_ref, OUT_TOL[dtype], "out")
    assert_lse_close(lse, lse_ref, LSE_TOL)


def test_kvcache_cu_seqlens_q_per_token_int8(device):
    dtype, hk, seqs = torch.float16, 2, [(3, 33), (1, 16), (6, 6)]
    q, kc, vc, table, cu_q, lens_k = make_batch(seqs, 4, hk, 64, 16, dtype)
    kq, ks = fmha.quantize_kv_cache(kc, torch.int8, scaling="token")
    vq, vs = fmha.quantize_kv_cache(vc, torch.int8, scaling="token")
    out_ref, _ = reference(q, kq, vq, table, cu_q, lens_k, ks, vs, causal=True)
    args = on(device, q, kq, vq, table, cu_q, lens_k, ks, vs)
    q_, kq_, vq_, table_, cu_q_, lens_k_, ks_, vs_ = args
    out = fmha.flash_attn_with_kvcache(q_, kq_, vq_, cache_seqlens=lens_k_, block_table=table_, causal=True,
                                       k_scale=ks_, v_scale=vs_, cu_seqlens_q=cu_q_, max_seqlen_q=6)
    assert_close(out, out_ref, 4 * OUT_TOL[dtype], "int8 per-token out")


def test_paged_varlen_is_forward_only(device):
    q, kc, vc, table, cu_q, lens_k = on(device, *make_batch([(3, 20), (1, 9)], 4, 2, 32, 16, torch.float16))
    q.requires_grad_()
    out = fmha.flash_attn_varlen_func(q, kc, vc, cu_q, max_seqlen_q=3, seqused_k=lens_k, block_table=table,
                                      causal=True)
    assert out.requires_grad
    with pytest.raises(RuntimeError, match="block_table.*forward-only"):
        out.sum().backward()
    with torch.no_grad():
        assert not fmha.flash_attn_varlen_func(q, kc, vc, cu_q, max_seqlen_q=3, seqused_k=lens_k,
                                               block_table=table).requires_grad


def test_paged_varlen_return_attn_probs(device):
    q, kc, vc, table, cu_q, lens_k = on(device, *make_batch([(3, 20)], 4, 2, 32, 16, torch.float16))
    out, lse, probs = fmha.flash_attn_varlen_func(q, kc, vc, cu_q, max_seqlen_q=3, seqused_k=lens_k,
                                                  block_table=table, return_attn_probs=True)
    assert lse.shape == (4, 3) and probs.numel() == 0


# ---------------------------------------------------------------------------------------
# Bad input and metadata checking
# ---------------------------------------------------------------------------------------


def _args():
    q, kc, vc, table, cu_q, lens_k = make_batch([(3, 20), (1, 9)], 4, 2, 32, 16, torch.float16)
    return dict(q=q, k=kc, v=vc, cu_seqlens_q=cu_q, max_seqlen_q=3, seqused_k=lens_k, block_table=table)


ERRORS = [
    ("q 4-D", lambda a: dict(q=a["q"][None]), ValueError, "q must be 3-D"),
    ("k not paged", lambda a: dict(k=a["k"][0], v=a["v"][0]), ValueError, "paged caches"),
    ("table 1-D", lambda a: dict(block_table=a["block_table"][0]), ValueError, "block_table must have shape"),
    ("table int64", lambda a: dict(block_table=a["block_table"].long()), TypeError, "block_table must be torch.int32"),
    ("cu_q length", lambda a: dict(cu_seqlens_q=a["cu_seqlens_q"][:2]), ValueError, r"cu_seqlens_q must have shape \(3,\)"),
    ("cu_q int64", lambda a: dict(cu_seqlens_q=a["cu_seqlens_q"].long()), TypeError, "cu_seqlens_q must be torch.int32"),
    ("no max_seqlen_q", lambda a: dict(max_seqlen_q=None), ValueError, "max_seqlen_q is required"),
    ("max_seqlen_q float", lambda a: dict(max_seqlen_q=3.0), TypeError, "max_seqlen_q must be an int"),
    ("no lengths", lambda a: dict(seqused_k=None), ValueError, "give seqused_k"),
    ("seqused_k shape", lambda a: dict(seqused_k=a["seqused_k"][:1]), ValueError, r"seqused_k must have shape \(2,\)"),
    ("seqused_k int64", lambda a: dict(seqused_k=a["seqused_k"].long()), TypeError, "seqused_k must be torch.int32"),
    ("page size", lambda a: dict(k=a["k"][:, :8], v=a["v"][:, :8]), ValueError, "multiple of 16"),
    ("table too narrow", lambda a: dict(seqused_k=torch.tensor([20, 49], dtype=I32)), ValueError,
     r"seqused_k\[1\] = 49 keys do not fit block_table's 3 pages"),
    ("seqused_k negative", lambda a: dict(seqused_k=torch.tensor([20, -1], dtype=I32)), ValueError,
     r"seqused_k\[1\] = -1 must be >= 0"),
    ("dropout", lambda a: dict(dropout_p=0.1), ValueError, "dropout_p must be 0"),
    ("q_descale dtype", lambda a: dict(q_descale=torch.ones(1, dtype=torch.float16)), TypeError,
     "q_descale must be torch.float32"),
    ("k_descale shape", lambda a: dict(k_descale=torch.ones(3, 2), v_descale=torch.ones(3, 2)), ValueError,
     "k_descale must be a scalar or have shape"),
    ("v differs", lambda a: dict(v=a["v"][:, :, :1]), ValueError, "v_cache must match k_cache"),
    ("heads", lambda a: dict(q=torch.randn(4, 3, 32).half()), ValueError, "multiple of the cache's"),
    ("out shape", lambda a: dict(out=torch.empty(4, 4, 16).half()), ValueError, "out must have shape"),
    ("num_splits", lambda a: dict(num_splits=-1), ValueError, "num_splits must be an int >= 0"),
    ("lse and probs", lambda a: dict(return_softmax_lse=True, return_attn_probs=True), ValueError, "cannot both"),
]


@pytest.mark.parametrize("what,over,exc,match", ERRORS, ids=[e[0] for e in ERRORS])
def test_paged_varlen_errors(device, what, over, exc, match):
    if what in ("table too narrow", "seqused_k negative") and device != "cpu":
        pytest.skip("read only when seqused_k is on the host; device-resident metadata is clamped "
                    "(test_gpu_packed_metadata_is_clamped) or checked by FMHA_CHECK_METADATA=1")
    a = _args()
    a.update(over(a))
    a = {n: x.to(device) if isinstance(x, torch.Tensor) else x for n, x in a.items()}
    with pytest.raises(exc, match=match):
        fmha.flash_attn_varlen_func(**a)


def test_kvcache_cu_seqlens_q_errors(device):
    a = _args()
    q, kc, vc, table, cu_q, lens = (a[n].to(device) for n in ("q", "k", "v", "block_table", "cu_seqlens_q",
                                                               "seqused_k"))
    call = lambda **kw: fmha.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=table,  # noqa: E731
                                                     **{"cu_seqlens_q": cu_q, "max_seqlen_q": 3, **kw})
    with pytest.raises(ValueError, match="given together"):
        call(max_seqlen_q=None)
    with pytest.raises(ValueError, match="cannot be combined with cu_seqlens_q"):
        call(k=torch.zeros(2, 1, 2, 32, dtype=q.dtype, device=device),
             v=torch.zeros(2, 1, 2, 32, dtype=q.dtype, device=device))
    with pytest.raises(ValueError, match="rotary_cos/rotary_sin cannot be combined"):
        cs = torch.ones(64, 8, dtype=q.dtype, device=device)
        call(rotary_cos=cs, rotary_sin=cs)
    with pytest.raises(ValueError, match="q must be 3-D"):
        call(max_seqlen_q=3, cu_seqlens_q=cu_q, **{}) if False else fmha.flash_attn_with_kvcache(
            q[None], kc, vc, cache_seqlens=lens, block_table=table, cu_seqlens_q=cu_q, max_seqlen_q=3)
    assert call().shape == q.shape


def test_cpu_backend_rejects_bad_packed_metadata():
    """The CPU backend reads the metadata and rejects what the GPU kernels would clamp."""
    a = _args()
    with pytest.raises(ValueError, match="more than max_seqlen_q"):
        fmha.flash_attn_varlen_func(**{**a, "max_seqlen_q": 2})
    with pytest.raises(ValueError, match="non-decreasing"):
        fmha.flash_attn_varlen_func(**{**a, "cu_seqlens_q": torch.tensor([0, 3, 2], dtype=I32)})


BAD_METADATA = [
    ("cu_q decreasing", dict(cu_seqlens_q=[0, 3, 2]), "cu_seqlens_q is decreasing"),
    ("cu_q past max", dict(cu_seqlens_q=[0, 1, 4], max_seqlen_q=2), "exceeds max_seqlen_q = 2"),
    ("cu_q past total", dict(cu_seqlens_q=[0, 3, 6], max_seqlen_q=3), r"cu_seqlens_q\[2\] = 6 exceeds the 4 rows"),
    ("seqused past capacity", dict(seqused_k=[20, 49]), r"seqused_k\)\[1\] = 49"),
    ("seqused negative", dict(seqused_k=[-1, 9]), r"seqused_k\)\[0\] = -1"),
    ("page out of range", dict(block_table=[[0, 99, 1], [2, 3, 4]]), r"block_table\[0\]\[1\] = 99"),
    ("page negative", dict(block_table=[[0, 1, 2], [-3, 3, 4]]), r"block_table\[1\]\[0\] = -3"),
]


@pytest.mark.parametrize("what,bad,match", BAD_METADATA, ids=[m[0] for m in BAD_METADATA])
def test_check_metadata_env(device, monkeypatch, what, bad, match):
    """FMHA_CHECK_METADATA=1 reads device metadata back and raises before the kernels run."""
    monkeypatch.setenv("FMHA_CHECK_METADATA", "1")
    a = _args()
    a["seqused_k"] = torch.tensor([20, 9], dtype=I32)
    for n, x in bad.items():
        a[n] = torch.tensor(x, dtype=I32) if isinstance(x, list) else x
    if what == "seqused past capacity":  # passes Python's host-side width check only off the CPU
        a["block_table"] = torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=I32)
        a["seqused_k"] = torch.tensor([20, 49], dtype=I32)
    a = {n: x.to(device) if isinstance(x, torch.Tensor) else x for n, x in a.items()}
    if device == "cpu" and what in ("seqused past capacity", "seqused negative"):  # the host checks come first
        with pytest.raises(ValueError, match="do not fit block_table" if "capacity" in what else "must be >= 0"):
            fmha.flash_attn_varlen_func(**a)
        return
    with pytest.raises(ValueError, match="FMHA_CHECK_METADATA: .*" + match if "FMHA" not in match else match):
        fmha.flash_attn_varlen_func(**a)


def test_gpu_packed_metadata_is_clamped(device):
    """cu_seqlens_q past total_q or max_seqlen_q, decreasing offsets, lengths past the
    table and pages past num_blocks: the GPU kernels clamp every index (no fault; run under
    compute-sanitizer to check the accesses)."""
    if device == "cpu":
        pytest.skip("the CPU backend rejects bad metadata instead")
    a = _args()
    cases = [dict(cu_seqlens_q=[0, 9, 2]), dict(cu_seqlens_q=[-5, 1 << 30, 3]), dict(seqused_k=[1 << 30, -7]),
             dict(block_table=[[0, 99, -1], [1 << 30, 3, 4]])]
    for case in cases:
        args = {**a, **{n: torch.tensor(x, dtype=I32) for n, x in case.items()}}
        args = {n: x.to(device) if isinstance(x, torch.Tensor) else x for n, x in args.items()}
        for splits in (1, 3):
            out = fmha.flash_attn_varlen_func(**args, causal=True, num_splits=splits)
            torch.cuda.synchronize()
            assert out.shape == a["q"].shape
