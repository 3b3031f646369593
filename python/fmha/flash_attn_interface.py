"""flash-attn 2.x's Python API, name for name: switching is one import line.

Every function here is a thin wrapper over ``torch.ops.fmha.fwd`` (ops.py; eager calls take
the same implementation without the dispatcher), which carries the autograd, so the packed
variants' gradients flow back into the packed tensor; float8_e4m3fn inputs go to
``torch.ops.fmha.fwd_fp8`` instead (FlashAttention-3's fp8 forward, forward only).
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from . import _checks
from . import ops as _ops

# out, or (out, softmax_lse, S_dmask) with return_attn_probs=True.
AttnOutput = Union[Tensor, Tuple[Tensor, Tensor, Tensor]]
Window = Sequence[int]  # (left, right); -1 = unbounded


def _attention(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
               dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
               deterministic, return_attn_probs, top_left=False, out=None, return_lse=False,
               s_aux=None, learnable_sink=None, descales=(None, None, None)):
    """Every flash_attn function's call.  descales: (q, k, v)_descale, checked by the caller
    (_input_descales); read for fp8 inputs (_attention_fp8), unused for the others."""
    if not (type(q) is Tensor and type(k) is Tensor and type(v) is Tensor
            and q.is_contiguous() and k.is_contiguous() and v.is_contiguous()):  # (the common case, first)
        q, k, v = _checks.contiguous_last(q), _checks.contiguous_last(k), _checks.contiguous_last(v)
        if not (isinstance(q, Tensor) and isinstance(k, Tensor) and isinstance(v, Tensor)):
            for name, x in (("q", q), ("k", k), ("v", v)):
                _checks._tensor(x, name)
    if _checks.is_fp8(q, k, v):
        return _attention_fp8(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
                              dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                              return_attn_probs, top_left, out, return_lse, s_aux, learnable_sink, descales)
    left, right = _checks.window(window_size, causal)
    s_aux = _checks.sink(s_aux, learnable_sink, q)
    if out is not None:  # v's head dim, which may differ from q's (ops.attention)
        _checks.out_tensor(out, tuple(q.shape[:-1]) + tuple(v.shape[-1:]), q, (("q", q), ("k", k), ("v", v)))
    if softmax_scale is None:  # from the QK head dim; D == 0 is rejected by the op, with a message
        softmax_scale = q.shape[-1] ** -0.5 if q.shape[-1] > 0 else 1.0
    out, lse, _rng, probs = _ops.attention(
        q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
        softmax_scale, softcap, left, right, top_left, alibi_slopes, dropout_p, deterministic,
        bool(return_attn_probs) and dropout_p > 0, None, out=out, s_aux=s_aux)
    if return_lse:
        return out, lse
    if return_attn_probs:
        return out, lse, q.new_empty(0) if probs is None else probs
    return out


def _attention_fp8(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, dropout_p,
                   softmax_scale, causal, window_size, softcap, alibi_slopes, return_attn_probs, top_left, out,
                   return_lse, s_aux, learnable_sink, descales):
    """_attention for float8_e4m3fn q, k, v: FlashAttention-3's fp8 forward (ops.attention_fp8),
    bfloat16 out.  What it does not take raises here, naming the argument."""
    if _checks._float(dropout_p, "dropout_p") != 0:
        raise ValueError(f"dropout_p must be 0 with fp8 inputs (the fp8 forward has no dropout), got {dropout_p}")
    for name, x in (("s_aux", s_aux), ("learnable_sink", learnable_sink)):
        if x is not None:
            raise ValueError(f"{name} (attention sinks) is not supported with fp8 inputs; pass bfloat16 or float16 "
                             f"q, k, v for sinks")
    if seqused_k is not None:
        raise ValueError("seqused_k is not supported with fp8 inputs: give each sequence its own keys through "
                         "cu_seqlens_k")
    if v.dim() and k.dim() and v.shape[-1] != k.shape[-1]:
        raise ValueError(f"v must have k's head dim {k.shape[-1]} with fp8 inputs, got {v.shape[-1]} (a head dim of "
                         f"its own for v needs bfloat16 or float16 inputs)")
    left, right = _checks.window(window_size, causal)
    if out is not None:
        _checks.out_tensor(out, q.shape, q, (("q", q), ("k", k), ("v", v)), dtype=torch.bfloat16)
    if softmax_scale is None:  # from the QK head dim; D == 0 is rejected by the op, with a message
        softmax_scale = q.shape[-1] ** -0.5 if q.shape[-1] > 0 else 1.0
    out, lse = _ops.attention_fp8(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                  softmax_scale, softcap, left, right, top_left, alibi_slopes, *descales, out=out)
    if return_lse:
        return out, lse
    return (out, lse, torch.empty(0, dtype=q.dtype, device=q.device)) if return_attn_probs else out


def _fixed(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
           deterministic, return_attn_probs, out=None, s_aux=None, learnable_sink=None,
           descales=(None, None, None)):
    if not (isinstance(q, Tensor) and isinstance(k, Tensor) and q.dim() == 4 and k.dim() == 4):
        for name, x in (("q", q), ("k", k)):
            _checks._tensor(x, name)
            if x.dim() != 4:
                raise ValueError(f"{name} must be 4-D (batch, seqlen, nheads, headdim), got shape {tuple(x.shape)}")
    if descales[0] is not None or descales[1] is not None or descales[2] is not None:
        _input_descales(q, k, q.shape[0], *descales)
    return _attention(q, k, v, None, None, None, q.shape[1], k.shape[1], dropout_p, softmax_scale, causal,
                      window_size, softcap, alibi_slopes, deterministic, return_attn_probs, False, out, False,
                      s_aux, learnable_sink, descales)


def _unpack(x, name: str, count: int, dim: int):
    _checks._tensor(x, name)
    if x.dim() <= dim or x.shape[dim] != count:
        layout = {(3, 2): "(batch, seqlen, 3, nheads, headdim)", (2, 2): "(batch, seqlen, 2, nheads_k, headdim)",
                  (3, 1): "(total, 3, nheads, headdim)", (2, 1): "(total, 2, nheads_k, headdim)"}[(count, dim)]
        raise ValueError(f"{name} must have shape {layout}, got {tuple(x.shape)}")
    return x.unbind(dim)


def flash_attn_func(q: Tensor, k: Tensor, v: Tensor, 
                    dropout_p: float = 0.0, softmax_scale: Optional[float] = None, causal: bool = False,
                    window_size: Window = (-1, -1), softcap: float = 0.0, alibi_slopes: Optional[Tensor] = None,
                    deterministic: bool = False, return_attn_probs: bool = False, *,
                    out: Optional[Tensor] = None, s_aux: Optional[Tensor] = None,
                    learnable_sink: Optional[Tensor] = None, q_descale: Optional[Tensor] = None,
                    k_descale: Optional[Tensor] = None, v_descale: Optional[Tensor] = None) -> AttnOutput:
    """Attention over q (batch, seqlen_q, nheads, headdim), k and v (batch, seqlen_k,
    nheads_k, headdim); nheads a multiple of nheads_k (MQA/GQA).  v may have its own head
    dim headdim_v (1-256; k and v then differ in the last dimension only, as in DeepSeek's
    MLA prefill, (192, 128)); out is then (batch, seqlen_q, nheads, headdim_v) and the scale
    defaults to headdim ** -0.5.  fmha's kernels take one head dim: the narrower side is
    zero-padded to the wider one, a cost of that padding (see docs/api.md).

    causal aligns the mask to the bottom-right corner: query i sees keys
    [i + seqlen_k - seqlen_q - window_size[0], i + seqlen_k - seqlen_q + window_size[1]]
    (-1 = unbounded; causal sets the right window to 0). softcap > 0 applies
    softcap * tanh(s / softcap); alibi_slopes (nheads,) or (batch, nheads) fp32 subtracts
    slope * |i + seqlen_k - seqlen_q - j|. Rows that see no key output 0.

    Returns out (batch, seqlen_q, nheads, headdim), or with return_attn_probs
    (out, softmax_lse (batch, nheads, seqlen_q), S_dmask), S_dmask being empty unless
    dropout_p > 0 (then the probabilities, negated where dropped; for testing).

    out= (keyword): a tensor of q's shape, dtype and device (any strides with a contiguous
    last dimension, sharing no memory with q, k, v) that receives the result and is
    returned.  With nothing to differentiate (inference) the kernel writes it directly and
    no output is allocated; a GPU copy is needed only when the kernels cannot address it
    (head dim not a multiple of 8, rows not 16-byte aligned).  When an input requires grad,
    the result is computed as usual and copied into out, so gradients through out are exact.

    s_aux (keyword; learnable_sink, FlashAttention-4's name, is the same): attention sinks,
    one logit per query head, shape (nheads,), float32 or q's dtype, on q's device.  Each
    logit joins its head's softmax denominator in every row and contributes no value:
    out = sum_j exp(s_ij - lse') v_j with lse' = log(sum_j exp(s_ij) + exp(s_aux[h])), and
    softmax_lse is lse'.  A row that sees no key outputs 0 and its lse' is s_aux[h].
    Differentiable in s_aux.  On CPU tensors non-finite logits raise ValueError (on a GPU
    the values are not read, which would cost a device synchronization).

    fp8 (FlashAttention-3's): q, k and v all torch.float8_e4m3fn run the fp8 forward of
    CUDA sm_90 (Hopper) GPUs, with q_descale, k_descale, v_descale (keyword-only, float32 on
    q's device: None for 1, one value of any shape, or (batch, nheads_k), per sequence and
    KV head) as dequantization factors: scores are
    softmax_scale * q_descale * k_descale * q.k, and the output is multiplied by v_descale.
    out (and out=) is then bfloat16, softmax_lse is of those scores.  Causal, windows,
    softcap, ALiBi and MQA/GQA as above, head dims 1-256; forward only (a backward through
    the result raises), no dropout, no s_aux.  The kernels load 16-byte rows: with a head
    dim that is a multiple of 16, every stride of q, k, v but the last must be a multiple of
    16 elements and their data 16-byte aligned, or ValueError names the tensor (nothing is
    copied behind your back); other head dims are zero-padded to a multiple of 16 (a copy of
    q, k, v, as the 16-bit path pads to a multiple of 8).  An 8-bit float that is not e4m3,
    or fp8 mixed with other dtypes, raises TypeError.  For other inputs the descales
    are checked (dtype, shape, device) and unused, as FlashAttention-3 ignores them.
    """
    return _fixed(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                  deterministic, return_attn_probs, out=out, s_aux=s_aux, learnable_sink=learnable_sink,
                  descales=(q_descale, k_descale, v_descale))


def flash_attn_qkvpacked_func(qkv: Tensor, 
                              dropout_p: float = 0.0, softmax_scale: Optional[float] = None, causal: bool = False,
                              window_size: Window = (-1, -1), softcap: float = 0.0, alibi_slopes: Optional[Tensor] = None,
                              deterministic: bool = False, return_attn_probs: bool = False, *,
                              s_aux: Optional[Tensor] = None, learnable_sink: Optional[Tensor] = None) -> AttnOutput:
    """flash_attn_func with qkv (batch, seqlen, 3, nheads, headdim); s_aux / learnable_sink
    as in flash_attn_func."""
    q, k, v = _unpack(qkv, "qkv", 3, 2)
    return _fixed(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                  deterministic, return_attn_probs, s_aux=s_aux, learnable_sink=learnable_sink)


def flash_attn_kvpacked_func(q: Tensor, kv: Tensor, 
                             dropout_p: float = 0.0, softmax_scale: Optional[float] = None, causal: bool = False,
                             window_size: Window = (-1, -1), softcap: float = 0.0, alibi_slopes: Optional[Tensor] = None,
                             deterministic: bool = False, return_attn_probs: bool = False, *,
                             s_aux: Optional[Tensor] = None, learnable_sink: Optional[Tensor] = None) -> AttnOutput:
    """flash_attn_func with kv (batch, seqlen_k, 2, nheads_k, headdim); s_aux /
    learnable_sink as in flash_attn_func."""
    k, v = _unpack(kv, "kv", 2, 2)
    return _fixed(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                  deterministic, return_attn_probs, s_aux=s_aux, learnable_sink=learnable_sink)


def flash_attn_varlen_func(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Optional[Tensor] = None,
                           max_seqlen_q: Optional[int] = None, max_seqlen_k: Optional[int] = None, dropout_p: float = 0.0,
                           softmax_scale: Optional[float] = None, causal: bool = False, window_size: Window = (-1, -1),
                           softcap: float = 0.0, alibi_slopes: Optional[Tensor] = None, deterministic: bool = False,
                           return_attn_probs: bool = False, block_table: Optional[Tensor] = None, *,
                           seqused_k: Optional[Tensor] = None, out: Optional[Tensor] = None,
                           return_softmax_lse: bool = False, num_splits: int = 0,
                           q_descale: Optional[Tensor] = None, k_descale: Optional[Tensor] = None,
                           v_descale: Optional[Tensor] = None, s_aux: Optional[Tensor] = None,
                           learnable_sink: Optional[Tensor] = None, fa_version: Optional[int] = None,
                           scheduler_metadata: Optional[Tensor] = None) -> AttnOutput:
    """Attention over packed sequences: q (total_q, nheads, headdim), k and v (total_k,
    nheads_k, headdim); sequence b owns rows cu_seqlens[b]:cu_seqlens[b + 1] (int32,
    batch + 1 entries). seqused_k (batch,) int32 limits sequence b to its first
    seqused_k[b] keys. Masks are per sequence, as in flash_attn_func. softmax_lse is
    (nheads, total_q).

    Paged KV (vLLM's call): with block_table (batch, max_num_blocks) int32, k and v are
    caches (num_blocks, page_size, nheads_k, headdim), page_size any multiple of 16, and
    sequence b's keys are the first seqused_k[b] positions of its pages (seqused_k (batch,)
    int32; or cu_seqlens_k's differences when seqused_k is None; cu_seqlens_k and
    max_seqlen_k may be omitted).  Queries of any count per sequence (cu_seqlens_q), causal
    aligned bottom-right on each sequence's lengths; windows, softcap, ALiBi, GQA; fp8 e4m3
    or int8 caches with k_descale/v_descale.  Forward only: dropout_p must be 0, and a
    backward through the result raises.  Device-resident metadata is clamped by the
    kernels; FMHA_CHECK_METADATA=1 checks it on the host first (a synchronization).  On
    compute capability 9.0 GPUs a call with prefill chunks (max_seqlen_q >= 64) over a
    16-bit cache runs the sm_90a forward reading the pages (docs/api.md).

    Keyword-only, FlashAttention-3's names: out= as in flash_attn_func ((total_q, nheads,
    headdim)); return_softmax_lse=True returns (out, softmax_lse) (not combinable with
    return_attn_probs, which returns the triple); num_splits (int >= 0) is accepted for
    FA3/vLLM compatibility and changes nothing: fmha's varlen kernels never split the key
    dimension, so every value, 0 included, computes what num_splits=1 does in FA3 (each
    row's keys reduced in one pass; see docs/api.md on batch invariance).
    q_descale, k_descale, v_descale (float32, a scalar or (batch, nheads_k), as vLLM passes
    them on every call) are FlashAttention-3's dequantization factors of fp8 inputs: with
    float8_e4m3fn q, k, v (CUDA sm_90) they scale the fp8 forward as in flash_attn_func,
    and for float16, bfloat16 or float32 inputs they are checked (dtype, shape, device) and
    have no effect, as in FA3.  The fp8 forward takes no block_table, seqused_k or dropout.

    v may have its own head dim, s_aux / learnable_sink are attention sinks: both as in
    flash_attn_func.  vLLM's keywords: fa_version (2 or 3) picks a FlashAttention
    implementation in vLLM; fmha has one, which computes what both compute, so it is
    checked and changes nothing.  scheduler_metadata (int32, from FA3's
    get_scheduler_metadata) is FA3's precomputed tile schedule, an optional hint FA3
    computes itself when absent; fmha's kernels schedule themselves, so it is accepted and
    not read.
    """
    if block_table is not None:
        if isinstance(q, Tensor) and q.dtype in _checks._FLOAT8:
            raise ValueError("block_table (a paged KV cache) is not supported with fp8 q: the fp8 forward reads "
                             "contiguous k and v (cu_seqlens_k); paged fp8 caches take a float16 or bfloat16 q "
                             "with k_descale/v_descale")
        _vllm_keywords(q, fa_version, scheduler_metadata)
        from .kvcache import paged_varlen
        return paged_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, dropout_p,
                            softmax_scale, causal, window_size, softcap, alibi_slopes, return_attn_probs,
                            block_table, out, return_softmax_lse, num_splits, q_descale, k_descale, v_descale,
                            s_aux, learnable_sink)
    if cu_seqlens_k is None or max_seqlen_q is None or max_seqlen_k is None:
        raise ValueError("cu_seqlens_k, max_seqlen_q and max_seqlen_k are required (without block_table)")
    _varlen_descales(q, k, cu_seqlens_q, q_descale, k_descale, v_descale)
    _vllm_keywords(q, fa_version, scheduler_metadata)
    _varlen_num_splits(num_splits)
    if not isinstance(return_softmax_lse, bool):
        raise TypeError(f"return_softmax_lse must be a bool, got {type(return_softmax_lse).__name__}")
    if return_softmax_lse and return_attn_probs:
        raise ValueError("return_softmax_lse and return_attn_probs cannot both be set: return_softmax_lse "
                         "returns (out, softmax_lse), return_attn_probs (out, softmax_lse, S_dmask)")
    return _attention(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
                      dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                      deterministic, return_attn_probs, out=out, return_lse=return_softmax_lse,
                      s_aux=s_aux, learnable_sink=learnable_sink, descales=(q_descale, k_descale, v_descale))


def _input_descales(q, k, batch, q_descale, k_descale, v_descale) -> None:
    """FlashAttention-3's q/k/v_descale (_checks.input_descale), for batch sequences: read
    by the fp8 forward, and, as FA3 applies them to fp8 inputs only, unused for others.
    With fp8 q they are left to ops.attention_fp8, which checks them against the call's
    dims (_checks.fp8_inputs): once per call."""
    if q_descale is None and k_descale is None and v_descale is None:
        return
    if isinstance(q, Tensor) and q.dtype in _checks._FLOAT8:
        return
    for name, x in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale)):
        if x is not None:
            _checks.input_descale(x, name, batch, k.shape[-2] if k.dim() >= 2 else 0, q)


def _varlen_descales(q, k, cu_seqlens_q, q_descale, k_descale, v_descale) -> None:
    """_input_descales on the varlen function (and its paged call), batch from cu_seqlens_q."""
    if q_descale is None and k_descale is None and v_descale is None:
        return
    for name, x in (("q", q), ("k", k), ("cu_seqlens_q", cu_seqlens_q)):
        _checks._tensor(x, name)
    _input_descales(q, k, cu_seqlens_q.numel() - 1, q_descale, k_descale, v_descale)


def _vllm_keywords(q, fa_version, scheduler_metadata) -> None:
    if fa_version is not None and (isinstance(fa_version, bool) or fa_version not in (2, 3)):
        raise ValueError(f"fa_version must be 2 or 3 (vLLM's FlashAttention versions; fmha computes what both "
                         f"compute), got {fa_version!r}")
    if scheduler_metadata is not None:
        _checks._tensor(scheduler_metadata, "scheduler_metadata")
        if scheduler_metadata.dtype != torch.int32:
            raise TypeError(f"scheduler_metadata must be torch.int32 (FA3's get_scheduler_metadata), got "
                            f"{scheduler_metadata.dtype}")
        _checks._same_device(scheduler_metadata, "scheduler_metadata", q)


def _varlen_num_splits(num_splits) -> None:
    if isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 0:
        raise ValueError(f"num_splits must be an int >= 0 (0 and 1 alike: the varlen kernels never split the "
                         f"keys), got {num_splits!r}")


def flash_attn_varlen_qkvpacked_func(qkv: Tensor, cu_seqlens: Tensor, max_seqlen: int, 
                                     dropout_p: float = 0.0, softmax_scale: Optional[float] = None, causal: bool = False,
                                     window_size: Window = (-1, -1), softcap: float = 0.0, alibi_slopes: Optional[Tensor] = None,
                                     deterministic: bool = False, return_attn_probs: bool = False, *,
                                     s_aux: Optional[Tensor] = None,
                                     learnable_sink: Optional[Tensor] = None) -> AttnOutput:
    """flash_attn_varlen_func with qkv (total, 3, nheads, headdim); s_aux / learnable_sink as
    in flash_attn_func."""
    q, k, v = _unpack(qkv, "qkv", 3, 1)
    return _attention(q, k, v, cu_seqlens, cu_seqlens, None, max_seqlen, max_seqlen, dropout_p,
                      softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                      return_attn_probs, s_aux=s_aux, learnable_sink=learnable_sink)


def flash_attn_varlen_kvpacked_func(q: Tensor, kv: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                                    max_seqlen_q: int, max_seqlen_k: int, 
                                    dropout_p: float = 0.0, softmax_scale: Optional[float] = None, causal: bool = False,
                                    window_size: Window = (-1, -1), softcap: float = 0.0, alibi_slopes: Optional[Tensor] = None,
                                    deterministic: bool = False, return_attn_probs: bool = False, *,
                                    s_aux: Optional[Tensor] = None,
                                    learnable_sink: Optional[Tensor] = None) -> AttnOutput:
    """flash_attn_varlen_func with kv (total_k, 2, nheads_k, headdim); s_aux /
    learnable_sink as in flash_attn_func."""
    k, v = _unpack(kv, "kv", 2, 1)
    return _attention(q, k, v, cu_seqlens_q, cu_seqlens_k, None, max_seqlen_q, max_seqlen_k, dropout_p,
                      softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                      return_attn_probs, s_aux=s_aux, learnable_sink=learnable_sink)
