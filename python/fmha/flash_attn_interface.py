"""flash-attn 2.x's Python API, name for name: switching is one import line.

Every function here is a thin wrapper over ``torch.ops.fmha.fwd`` (ops.py; eager calls take
the same implementation without the dispatcher), which carries the autograd, so the packed
variants' gradients flow back into the packed tensor.
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
               deterministic, return_attn_probs, top_left=False, out=None, return_lse=False):
    q, k, v = (_checks.contiguous_last(x) for x in (q, k, v))
    for name, x in (("q", q), ("k", k), ("v", v)):
        _checks._tensor(x, name)
    left, right = _checks.window(window_size, causal)
    if out is not None:
        _checks.out_tensor(out, q.shape, q, (("q", q), ("k", k), ("v", v)))
    if softmax_scale is None:  # D == 0 is rejected by the op, with a message
        softmax_scale = q.shape[-1] ** -0.5 if q.shape[-1] > 0 else 1.0
    out, lse, _rng, probs = _ops.attention(
        q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
        softmax_scale, softcap, left, right, top_left, alibi_slopes, dropout_p, deterministic,
        bool(return_attn_probs) and dropout_p > 0, None, out=out)
    if return_lse:
        return out, lse
    return (out, lse, probs) if return_attn_probs else out


def _fixed(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
           deterministic, return_attn_probs, out=None):
    for name, x in (("q", q), ("k", k)):
        _checks._tensor(x, name)
        if x.dim() != 4:
            raise ValueError(f"{name} must be 4-D (batch, seqlen, nheads, headdim), got shape {tuple(x.shape)}")
    return _attention(q, k, v, None, None, None, q.shape[1], k.shape[1], dropout_p, softmax_scale,
                      causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs,
                      out=out)


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
                    out: Optional[Tensor] = None) -> AttnOutput:
    """Attention over q (batch, seqlen_q, nheads, headdim), k and v (batch, seqlen_k,
    nheads_k, headdim); nheads a multiple of nheads_k (MQA/GQA).

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
    """
    return _fixed(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                  deterministic, return_attn_probs, out=out)


def flash_attn_qkvpacked_func(qkv: Tensor, 
                              dropout_p: float = 0.0, softmax_scale: Optional[float] = None, causal: bool = False,
                              window_size: Window = (-1, -1), softcap: float = 0.0, alibi_slopes: Optional[Tensor] = None,
                              deterministic: bool = False, return_attn_probs: bool = False) -> AttnOutput:
    """flash_attn_func with qkv (batch, seqlen, 3, nheads, headdim)."""
    q, k, v = _unpack(qkv, "qkv", 3, 2)
    return _fixed(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                  deterministic, return_attn_probs)


def flash_attn_kvpacked_func(q: Tensor, kv: Tensor, 
                             dropout_p: float = 0.0, softmax_scale: Optional[float] = None, causal: bool = False,
                             window_size: Window = (-1, -1), softcap: float = 0.0, alibi_slopes: Optional[Tensor] = None,
                             deterministic: bool = False, return_attn_probs: bool = False) -> AttnOutput:
    """flash_attn_func with kv (batch, seqlen_k, 2, nheads_k, headdim)."""
    k, v = _unpack(kv, "kv", 2, 2)
    return _fixed(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                  deterministic, return_attn_probs)


def flash_attn_varlen_func(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                           max_seqlen_q: int, max_seqlen_k: int, dropout_p: float = 0.0,
                           softmax_scale: Optional[float] = None, causal: bool = False, window_size: Window = (-1, -1),
                           softcap: float = 0.0, alibi_slopes: Optional[Tensor] = None, deterministic: bool = False,
                           return_attn_probs: bool = False, block_table: Optional[Tensor] = None, *,
                           seqused_k: Optional[Tensor] = None, out: Optional[Tensor] = None,
                           return_softmax_lse: bool = False, num_splits: int = 0,
                           q_descale: Optional[Tensor] = None, k_descale: Optional[Tensor] = None,
                           v_descale: Optional[Tensor] = None) -> AttnOutput:
    """Attention over packed sequences: q (total_q, nheads, headdim), k and v (total_k,
    nheads_k, headdim); sequence b owns rows cu_seqlens[b]:cu_seqlens[b + 1] (int32,
    batch + 1 entries). seqused_k (batch,) int32 limits sequence b to its first
    seqused_k[b] keys. Masks are per sequence, as in flash_attn_func. softmax_lse is
    (nheads, total_q). block_table (paged KV) raises ValueError: paged caches are read by
    fmha.flash_attn_with_kvcache.

    Keyword-only, FlashAttention-3's names: out= as in flash_attn_func ((total_q, nheads,
    headdim)); return_softmax_lse=True returns (out, softmax_lse) (not combinable with
    return_attn_probs, which returns the triple); num_splits (int >= 0) is accepted for
    FA3/vLLM compatibility and changes nothing: fmha's varlen kernels never split the key
    dimension, so every value, 0 included, computes what num_splits=1 does in FA3 (each
    row's keys reduced in one pass; see docs/api.md on batch invariance).  q_descale,
    k_descale, v_descale describe fp8 inputs, which these kernels do not take: giving any
    of them raises ValueError (fp8 KV caches are read by flash_attn_with_kvcache).
    """
    if block_table is not None:
        raise ValueError("block_table (paged KV) is not supported by flash_attn_varlen_func: pass contiguous k "
                         "and v, or read paged caches with fmha.flash_attn_with_kvcache")
    for name, x in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale)):
        if x is not None:
            raise ValueError(f"{name} is not supported by flash_attn_varlen_func: it describes fp8 q/k/v, and "
                             f"fmha's varlen kernels compute in float16, bfloat16 or float32 only (fp8 KV caches "
                             f"with k_descale/v_descale are read by fmha.flash_attn_with_kvcache)")
    _varlen_num_splits(num_splits)
    if not isinstance(return_softmax_lse, bool):
        raise TypeError(f"return_softmax_lse must be a bool, got {type(return_softmax_lse).__name__}")
    if return_softmax_lse and return_attn_probs:
        raise ValueError("return_softmax_lse and return_attn_probs cannot both be set: return_softmax_lse "
                         "returns (out, softmax_lse), return_attn_probs (out, softmax_lse, S_dmask)")
    return _attention(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
                      dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                      deterministic, return_attn_probs, out=out, return_lse=return_softmax_lse)


def _varlen_num_splits(num_splits) -> None:
    if isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 0:
        raise ValueError(f"num_splits must be an int >= 0 (0 and 1 alike: the varlen kernels never split the "
                         f"keys), got {num_splits!r}")


def flash_attn_varlen_qkvpacked_func(qkv: Tensor, cu_seqlens: Tensor, max_seqlen: int, 
                                     dropout_p: float = 0.0, softmax_scale: Optional[float] = None, causal: bool = False,
                                     window_size: Window = (-1, -1), softcap: float = 0.0, alibi_slopes: Optional[Tensor] = None,
                                     deterministic: bool = False, return_attn_probs: bool = False) -> AttnOutput:
    """flash_attn_varlen_func with qkv (total, 3, nheads, headdim)."""
    q, k, v = _unpack(qkv, "qkv", 3, 1)
    return _attention(q, k, v, cu_seqlens, cu_seqlens, None, max_seqlen, max_seqlen, dropout_p,
                      softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                      return_attn_probs)


def flash_attn_varlen_kvpacked_func(q: Tensor, kv: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                                    max_seqlen_q: int, max_seqlen_k: int, 
                                    dropout_p: float = 0.0, softmax_scale: Optional[float] = None, causal: bool = False,
                                    window_size: Window = (-1, -1), softcap: float = 0.0, alibi_slopes: Optional[Tensor] = None,
                                    deterministic: bool = False, return_attn_probs: bool = False) -> AttnOutput:
    """flash_attn_varlen_func with kv (total_k, 2, nheads_k, headdim)."""
    k, v = _unpack(kv, "kv", 2, 1)
    return _attention(q, k, v, cu_seqlens_q, cu_seqlens_k, None, max_seqlen_q, max_seqlen_k, dropout_p,
                      softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                      return_attn_probs)
