"""fmha called exactly as vLLM's FlashAttention backend calls flash_attn_varlen_func
(vllm/v1/attention/backends/flash_attn.py, FlashAttentionImpl.forward and
_forward_encoder_attention): every keyword it passes (q, k, v, out, cu_seqlens_q,
max_seqlen_q, seqused_k, max_seqlen_k, softmax_scale, causal, alibi_slopes, window_size,
block_table, softcap, scheduler_metadata, fa_version, q/k/v_descale, num_splits, s_aux), on
mixed batches of prefill, chunked-prefill, speculative-decode and decode requests, against
the float64 reference (tests/reference.py).

vLLM's decoder call reads the paged cache through block_table with seqused_k and no
cu_seqlens_k; the same call over contiguous per-sequence caches (cu_seqlens_k with
seqused_k instead of block_table, everything else as vLLM passes it) runs too.

As vLLM does: the query and output buffers are padded past num_actual_tokens (CUDA-graph
sizes); the rows past it are garbage in the query and must stay untouched in the output;
cache slots past each sequence's length hold garbage; q/k/v_descale are the layer's unit
scales expanded to (num_seqs, num_kv_heads); sinks are in the model dtype."""

import math
from dataclasses import dataclass
from typing import Optional

import pytest
import torch

import fmha
from conftest import OUT_TOL, assert_close, dtype_id, poisoned_outputs, randn
from reference import attention_ref

# (query_len, seq_len) per request; seq_len counts the new tokens (vLLM's seq_lens).
MIXED = [(37, 37),   # prefill
         (1, 70),    # decode
         (6, 83),    # chunked prefill / speculative decode (5 draft tokens + 1)
         (1, 1),     # a one-token prompt
         (23, 40),   # chunked prefill of a longer prompt
         (1, 129)]   # decode past a page boundary
BLOCK_SIZE = 16


@dataclass
class Impl:
    """What FlashAttentionImpl holds (its __init__'s arguments, as vLLM stores them)."""
    num_heads: int
    num_kv_heads: int
    head_size: int
    scale: float
    alibi_slopes: Optional[torch.Tensor]
    sliding_window: tuple
    logits_soft_cap: float
    sinks: Optional[torch.Tensor]
    vllm_flash_attn_version: int


@dataclass
class Metadata:
    """The FlashAttentionMetadata fields the call reads."""
    num_actual_tokens: int
    max_query_len: int
    query_start_loc: torch.Tensor
    max_seq_len: int
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    scheduler_metadata: Optional[torch.Tensor]
    max_num_splits: int
    causal: bool = True


def make_impl(dtype, device, *, heads=(8, 2), head_size=64, sliding_window=None, alibi=False, softcap=None,
              sinks=False, fa_version=3):
    hq, hk = heads
    # FlashAttentionImpl.__init__: window (w - 1, 0) for decoders, softcap 0 when None,
    # ALiBi slopes as a float32 tensor, sinks a tensor in the model dtype (gpt-oss).
    return Impl(num_heads=hq, num_kv_heads=hk, head_size=head_size, scale=float(head_size ** -0.5),
                alibi_slopes=(torch.rand(hq) * 0.1).to(device) if alibi else None,
                sliding_window=(-1, -1) if sliding_window is None else (sliding_window - 1, 0),
                logits_soft_cap=0 if softcap is None else softcap,
                sinks=(torch.randn(hq) + 1.5).to(device=device, dtype=dtype) if sinks else None,
                vllm_flash_attn_version=fa_version)


class Layer:
    """The attention layer's unit scales (vLLM's _q_scale/_k_scale/_v_scale: 0-d float32)."""

    def __init__(self, device):
        self._q_scale, self._k_scale, self._v_scale = (torch.tensor(1.0, dtype=torch.float32, device=device)
                                                       for _ in range(3))


def make_batch(impl, dtype, device, requests, padded_tokens, num_splits=0, scheduler_metadata=False):
    """Random keys/values per request, laid out twice: a paged cache (vLLM's layout
    (2, num_blocks, block_size, Hk, D), pages shuffled, spare pages and slots past each
    length filled with garbage) with its block table, and contiguous per-request caches of
    page-rounded capacity (cu_seqlens_k) holding the same values.  Returns the query buffer
    (padded_tokens rows, garbage past num_actual_tokens), a NaN output buffer, the metadata,
    both caches and the reference's keys/values."""
    hq, hk, d = impl.num_heads, impl.num_kv_heads, impl.head_size
    q_lens = [a for a, _ in requests]
    seq_lens = [b for _, b in requests]
    n = sum(q_lens)
    keys = [randn(s, hk, d, dtype=dtype) for s in seq_lens]
    values = [randn(s, hk, d, dtype=dtype) for s in seq_lens]
    pages = [-(-s // BLOCK_SIZE) for s in seq_lens]
    num_blocks = sum(pages) + 3
    kv_cache = randn(2, num_blocks, BLOCK_SIZE, hk, d, dtype=dtype, scale=50.0)  # garbage everywhere
    order = torch.randperm(num_blocks).tolist()
    block_table = torch.zeros(len(requests), max(pages) + 2, dtype=torch.int32)  # vLLM pads with 0
    caps = [p * BLOCK_SIZE for p in pages]
    k_contig = randn(sum(caps), hk, d, dtype=dtype, scale=50.0)
    v_contig = randn(sum(caps), hk, d, dtype=dtype, scale=50.0)
    start = 0
    for b, (s, npg) in enumerate(zip(seq_lens, pages)):
        ids = [order.pop() for _ in range(npg)]
        block_table[b, :npg] = torch.tensor(ids, dtype=torch.int32)
        for i in range(s):
            kv_cache[0, ids[i // BLOCK_SIZE], i % BLOCK_SIZE] = keys[b][i]
            kv_cache[1, ids[i // BLOCK_SIZE], i % BLOCK_SIZE] = values[b][i]
        k_contig[start:start + s], v_contig[start:start + s] = keys[b], values[b]
        start += caps[b]
    cu_q = torch.tensor([0] + q_lens, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    cu_caps = torch.tensor([0] + caps, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    query = randn(padded_tokens, hq, d, dtype=dtype)
    query[n:] = randn(padded_tokens - n, hq, d, dtype=dtype, scale=1e3)  # padding rows: garbage
    meta = Metadata(num_actual_tokens=n, max_query_len=max(q_lens), query_start_loc=cu_q.to(device),
                    max_seq_len=max(seq_lens), seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
                    block_table=block_table.to(device),
                    scheduler_metadata=(torch.zeros(len(requests) + 1, dtype=torch.int32, device=device)
                                        if scheduler_metadata else None),
                    max_num_splits=num_splits)
    output = torch.full((padded_tokens, hq, d), math.nan, dtype=dtype, device=device)
    ref_k, ref_v = torch.cat(keys), torch.cat(values)
    cu_ref = torch.tensor([0] + seq_lens, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    return dict(query=query.to(device), output=output, meta=meta, kv_cache=kv_cache.to(device),
                k_contig=k_contig.to(device), v_contig=v_contig.to(device), cu_seqlens_k=cu_caps.to(device),
                max_capacity=max(caps),
                ref=(ref_k, ref_v, cu_q, cu_ref))


def reference(impl, batch):
    ref_k, ref_v, cu_q, cu_k = batch["ref"]
    n = batch["meta"].num_actual_tokens
    sinks = None if impl.sinks is None else impl.sinks.cpu()
    out, _ = attention_ref(batch["query"][:n].cpu(), ref_k, ref_v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                           softmax_scale=impl.scale, causal=True, window_size=impl.sliding_window,
                           softcap=float(impl.logits_soft_cap),
                           alibi_slopes=None if impl.alibi_slopes is None else impl.alibi_slopes.cpu(), s_aux=sinks)
    return out


def check_output(impl, batch, dtype):
    output, n = batch["output"].cpu(), batch["meta"].num_actual_tokens
    assert torch.isnan(output[n:]).all(), "rows past num_actual_tokens were written"
    assert_close(output[:n], reference(impl, batch), OUT_TOL[dtype], "output")


# ---------------------------------------------------------------------------------------
# The calls, keyword for keyword as vLLM makes them
# ---------------------------------------------------------------------------------------


def vllm_decoder_call_paged(impl, layer, query, key_cache, value_cache, output, attn_metadata):
    """FlashAttentionImpl.forward, the non-cascade branch, verbatim but for the names."""
    num_actual_tokens = attn_metadata.num_actual_tokens
    cu_seqlens_q = attn_metadata.query_start_loc
    seqused_k = attn_metadata.seq_lens
    max_seqlen_q = attn_metadata.max_query_len
    max_seqlen_k = attn_metadata.max_seq_len
    block_table = attn_metadata.block_table
    scheduler_metadata = attn_metadata.scheduler_metadata
    descale_shape = (cu_seqlens_q.shape[0] - 1, impl.num_kv_heads)
    fmha.flash_attn_varlen_func(
        q=query[:num_actual_tokens],
        k=key_cache,
        v=value_cache,
        out=output[:num_actual_tokens],
        cu_seqlens_q=cu_seqlens_q,
        max_seqlen_q=max_seqlen_q,
        seqused_k=seqused_k,
        max_seqlen_k=max_seqlen_k,
        softmax_scale=impl.scale,
        causal=attn_metadata.causal,
        alibi_slopes=impl.alibi_slopes,
        window_size=impl.sliding_window,
        block_table=block_table,
        softcap=impl.logits_soft_cap,
        scheduler_metadata=scheduler_metadata,
        fa_version=impl.vllm_flash_attn_version,
        q_descale=layer._q_scale.expand(descale_shape),
        k_descale=layer._k_scale.expand(descale_shape),
        v_descale=layer._v_scale.expand(descale_shape),
        num_splits=attn_metadata.max_num_splits,
        s_aux=impl.sinks,
    )
    return output


def vllm_decoder_call_contiguous(impl, layer, query, k, v, cu_seqlens_k, max_capacity, output, attn_metadata):
    """The same call over contiguous per-request caches: cu_seqlens_k (each request's
    capacity) instead of block_table, seqused_k still each request's length.  max_seqlen_k
    covers the capacities: fmha requires every cu_seqlens_k span to fit in it, seqused_k or
    not."""
    num_actual_tokens = attn_metadata.num_actual_tokens
    cu_seqlens_q = attn_metadata.query_start_loc
    seqused_k = attn_metadata.seq_lens
    max_seqlen_q = attn_metadata.max_query_len
    max_seqlen_k = attn_metadata.max_seq_len
    scheduler_metadata = attn_metadata.scheduler_metadata
    descale_shape = (cu_seqlens_q.shape[0] - 1, impl.num_kv_heads)
    fmha.flash_attn_varlen_func(
        q=query[:num_actual_tokens],
        k=k,
        v=v,
        out=output[:num_actual_tokens],
        cu_seqlens_q=cu_seqlens_q,
        max_seqlen_q=max_seqlen_q,
        cu_seqlens_k=cu_seqlens_k,
        seqused_k=seqused_k,
        max_seqlen_k=max(max_seqlen_k, max_capacity),
        softmax_scale=impl.scale,
        causal=attn_metadata.causal,
        alibi_slopes=impl.alibi_slopes,
        window_size=impl.sliding_window,
        block_table=None,
        softcap=impl.logits_soft_cap,
        scheduler_metadata=scheduler_metadata,
        fa_version=impl.vllm_flash_attn_version,
        q_descale=layer._q_scale.expand(descale_shape),
        k_descale=layer._k_scale.expand(descale_shape),
        v_descale=layer._v_scale.expand(descale_shape),
        num_splits=attn_metadata.max_num_splits,
        s_aux=impl.sinks,
    )
    return output


# (id, make_impl keywords, num_splits, scheduler_metadata given): the models vLLM serves
# with this backend, by the features they use.
CONFIGS = [
    ("llama-gqa", dict(), 0, False),
    ("gpt-oss-sinks-window", dict(sliding_window=32, sinks=True), 0, True),
    ("gpt-oss-sinks-cudagraph", dict(sinks=True), 32, True),
    # Gemma 2 caps at 50, which at these scores (|s| of a few) caps nothing measurable: 5 does.
    ("softcap-window", dict(heads=(4, 2), head_size=128, sliding_window=48, softcap=5.0), 0, False),
    ("alibi-mqa-fa2", dict(heads=(4, 1), alibi=True, fa_version=2), 0, False),
]


@pytest.mark.parametrize("config", CONFIGS, ids=[c[0] for c in CONFIGS])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=dtype_id)
def test_decoder_call_contiguous(device, dtype, config):
    _, impl_kw, num_splits, sched = config
    impl = make_impl(dtype, device, **impl_kw)
    batch = make_batch(impl, dtype, device, MIXED, padded_tokens=80, num_splits=num_splits,
                       scheduler_metadata=sched)
    with poisoned_outputs():
        vllm_decoder_call_contiguous(impl, Layer(device), batch["query"], batch["k_contig"], batch["v_contig"],
                                     batch["cu_seqlens_k"], batch["max_capacity"], batch["output"], batch["meta"])
    check_output(impl, batch, dtype)


@pytest.mark.parametrize("config", CONFIGS, ids=[c[0] for c in CONFIGS])
@pytest.mark.parametrize("dtype", [torch.bfloat16], ids=dtype_id)
def test_decoder_call_paged(device, dtype, config):
    _, impl_kw, num_splits, sched = config
    impl = make_impl(dtype, device, **impl_kw)
    batch = make_batch(impl, dtype, device, MIXED, padded_tokens=80, num_splits=num_splits,
                       scheduler_metadata=sched)
    key_cache, value_cache = batch["kv_cache"].unbind(0)
    with poisoned_outputs(expect_calls=False):
        vllm_decoder_call_paged(impl, Layer(device), batch["query"], key_cache, value_cache, batch["output"],
                                batch["meta"])
    check_output(impl, batch, dtype)


def test_decode_only_batch_contiguous(device):
    # A pure decode step (every query_len 1), as a captured decode graph runs it.
    dtype = torch.bfloat16
    impl = make_impl(dtype, device, sinks=True, sliding_window=64)
    batch = make_batch(impl, dtype, device, [(1, 5), (1, 90), (1, 33), (1, 128)], padded_tokens=8, num_splits=32)
    vllm_decoder_call_contiguous(impl, Layer(device), batch["query"], batch["k_contig"], batch["v_contig"],
                                 batch["cu_seqlens_k"], batch["max_capacity"], batch["output"], batch["meta"])
    check_output(impl, batch, dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=dtype_id)
def test_encoder_call(device, dtype):
    # FlashAttentionImpl._forward_encoder_attention: no cache, cu_seqlens_k = cu_seqlens_q,
    # bidirectional, the layer's descales, no block_table / seqused_k / num_splits / s_aux.
    impl = make_impl(dtype, device, heads=(6, 3), head_size=80)
    lens = [17, 1, 40, 9]
    n = sum(lens)
    query, key, value = (randn(n, h, 80, dtype=dtype, device=device) for h in (6, 3, 3))
    output = torch.full((n, 6, 80), math.nan, dtype=dtype, device=device)
    cu_seqlens_q = torch.tensor([0] + lens, dtype=torch.int32, device=device).cumsum(0, dtype=torch.int32)
    cu_seqlens_k = cu_seqlens_q
    max_seqlen_q = max_seqlen_k = max(lens)
    layer = Layer(device)
    descale_shape = (cu_seqlens_q.shape[0] - 1, impl.num_kv_heads)
    with poisoned_outputs():
        fmha.flash_attn_varlen_func(
            q=query,
            k=key,
            v=value,
            out=output,
            cu_seqlens_q=cu_seqlens_q,
            cu_seqlens_k=cu_seqlens_k,
            max_seqlen_q=max_seqlen_q,
            max_seqlen_k=max_seqlen_k,
            softmax_scale=impl.scale,
            causal=False,
            alibi_slopes=impl.alibi_slopes,
            window_size=impl.sliding_window,
            softcap=impl.logits_soft_cap,
            fa_version=impl.vllm_flash_attn_version,
            q_descale=layer._q_scale.expand(descale_shape),
            k_descale=layer._k_scale.expand(descale_shape),
            v_descale=layer._v_scale.expand(descale_shape),
        )
    ref, _ = attention_ref(query.cpu(), key.cpu(), value.cpu(), cu_seqlens_q=cu_seqlens_q.cpu(),
                           cu_seqlens_k=cu_seqlens_k.cpu(), softmax_scale=impl.scale)
    assert_close(output.cpu(), ref, OUT_TOL[dtype], "output")


def test_vllm_only_keywords(device):
    # fa_version and scheduler_metadata change nothing; bad values are named.
    dtype = torch.bfloat16
    impl = make_impl(dtype, device)
    batch = make_batch(impl, dtype, device, [(3, 20), (1, 9)], padded_tokens=4)
    q, k, v, cu_k = batch["query"][:4], batch["k_contig"], batch["v_contig"], batch["cu_seqlens_k"]
    meta = batch["meta"]
    args = (q, k, v, meta.query_start_loc, cu_k, 3, 32)
    want = fmha.flash_attn_varlen_func(*args, causal=True, seqused_k=meta.seq_lens)
    for fa_version in (2, 3):
        got = fmha.flash_attn_varlen_func(*args, causal=True, seqused_k=meta.seq_lens, fa_version=fa_version,
                                          scheduler_metadata=torch.zeros(7, dtype=torch.int32, device=device))
        assert torch.equal(got, want)
    for bad in (1, 4, "3", True):
        with pytest.raises(ValueError, match="fa_version must be 2 or 3"):
            fmha.flash_attn_varlen_func(*args, fa_version=bad)
    with pytest.raises(TypeError, match="scheduler_metadata must be torch.int32"):
        fmha.flash_attn_varlen_func(*args, scheduler_metadata=torch.zeros(3, device=device))
    with pytest.raises(TypeError, match="scheduler_metadata must be a torch.Tensor"):
        fmha.flash_attn_varlen_func(*args, scheduler_metadata=[0, 1])
