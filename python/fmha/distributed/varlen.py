"""Varlen (packed documents) ring attention, ring-flash-attention's names and signatures.

Every document is split the same way over the ranks: ``ring_flash_attn_varlen_func``, rank r
holds part r of W equal parts of each document; ``zigzag_ring_flash_attn_varlen_func``,
chunks r and 2W-1-r of 2W.  q, k, v are the local rows (local total, nheads(_k), headdim);
``cu_seqlens`` (int32) and ``max_seqlen`` describe the *local* documents (each global length
divided by W), the same on every rank (fmha.distributed.shard_varlen builds them).  Windows
are not supported here (ValueError; llama3_flash_attn_varlen_func takes causal windows).
"""

from __future__ import annotations

from typing import Optional

from torch import Tensor

from . import _args
from ._ring import RingAttention, VarlenGeom


def _run(name, layout, q, k, v, cu_seqlens, max_seqlen, dropout_p, softmax_scale, causal, window_size,
         alibi_slopes, deterministic, return_attn_probs, group, softcap):
    scale, softcap, left, right, _rank, world = _args.common(
        name, q, k, v, dropout_p, softmax_scale, causal, window_size, alibi_slopes, softcap, group)
    _args.varlen_shapes(name, q, k, v, cu_seqlens)
    _args.no_window(name, left, right, causal)
    geom = VarlenGeom(layout, cu_seqlens, max_seqlen, world, causal)
    if geom.total != q.shape[0]:
        raise ValueError(f"{name}: cu_seqlens[-1] = {geom.total} must equal q's local rows, {q.shape[0]}")
    out, lse = RingAttention.apply(q, k, v, geom, scale, softcap, bool(deterministic), group)
    return _args.result(out, lse, return_attn_probs)


def ring_flash_attn_varlen_func(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, max_seqlen: int,
                                dropout_p: float = 0.0, softmax_scale: Optional[float] = None, causal: bool = False,
                                window_size=(-1, -1), alibi_slopes: Optional[Tensor] = None,
                                deterministic: bool = False, return_attn_probs: bool = False, group=None, *,
                                softcap: float = 0.0):
    """Ring attention over packed documents, rank r holding part r of W of each one.
    Returns out (local total, nheads, headdim), or (out, softmax_lse (nheads, local total),
    None) with return_attn_probs."""
    return _run("ring_flash_attn_varlen_func", "ring", q, k, v, cu_seqlens, max_seqlen, dropout_p, softmax_scale,
                causal, window_size, alibi_slopes, deterministic, return_attn_probs, group, softcap)


def ring_flash_attn_varlen_kvpacked_func(q: Tensor, kv: Tensor, cu_seqlens: Tensor, max_seqlen: int,
                                         dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                                         causal: bool = False, window_size=(-1, -1),
                                         alibi_slopes: Optional[Tensor] = None, deterministic: bool = False,
                                         return_attn_probs: bool = False, group=None, *, softcap: float = 0.0):
    """ring_flash_attn_varlen_func with kv (local total, 2, nheads_k, headdim)."""
    k, v = _args.unpack(kv, "kv", 2, 1)
    return _run("ring_flash_attn_varlen_kvpacked_func", "ring", q, k, v, cu_seqlens, max_seqlen, dropout_p,
                softmax_scale, causal, window_size, alibi_slopes, deterministic, return_attn_probs, group, softcap)


def ring_flash_attn_varlen_qkvpacked_func(qkv: Tensor, cu_seqlens: Tensor, max_seqlen: int, dropout_p: float = 0.0,
                                          softmax_scale: Optional[float] = None, causal: bool = False,
                                          window_size=(-1, -1), alibi_slopes: Optional[Tensor] = None,
                                          deterministic: bool = False, return_attn_probs: bool = False, group=None,
                                          *, softcap: float = 0.0):
    """ring_flash_attn_varlen_func with qkv (local total, 3, nheads, headdim)."""
    q, k, v = _args.unpack(qkv, "qkv", 3, 1)
    return _run("ring_flash_attn_varlen_qkvpacked_func", "ring", q, k, v, cu_seqlens, max_seqlen, dropout_p,
                softmax_scale, causal, window_size, alibi_slopes, deterministic, return_attn_probs, group, softcap)


def zigzag_ring_flash_attn_varlen_func(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, max_seqlen: int,
                                       dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                                       causal: bool = False, window_size=(-1, -1),
                                       alibi_slopes: Optional[Tensor] = None, deterministic: bool = False,
                                       return_attn_probs: bool = False, group=None, *, softcap: float = 0.0):
    """Ring attention over packed documents, rank r holding chunks r and 2W-1-r of 2W of each
    one (every global length a multiple of 2W).  Returns as ring_flash_attn_varlen_func."""
    return _run("zigzag_ring_flash_attn_varlen_func", "zigzag", q, k, v, cu_seqlens, max_seqlen, dropout_p,
                softmax_scale, causal, window_size, alibi_slopes, deterministic, return_attn_probs, group, softcap)


def zigzag_ring_flash_attn_varlen_kvpacked_func(q: Tensor, kv: Tensor, cu_seqlens: Tensor, max_seqlen: int,
                                                dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                                                causal: bool = False, window_size=(-1, -1),
                                                alibi_slopes: Optional[Tensor] = None, deterministic: bool = False,
                                                return_attn_probs: bool = False, group=None, *,
                                                softcap: float = 0.0):
    """zigzag_ring_flash_attn_varlen_func with kv (local total, 2, nheads_k, headdim)."""
    k, v = _args.unpack(kv, "kv", 2, 1)
    return _run("zigzag_ring_flash_attn_varlen_kvpacked_func", "zigzag", q, k, v, cu_seqlens, max_seqlen, dropout_p,
                softmax_scale, causal, window_size, alibi_slopes, deterministic, return_attn_probs, group, softcap)


def zigzag_ring_flash_attn_varlen_qkvpacked_func(qkv: Tensor, cu_seqlens: Tensor, max_seqlen: int,
                                                 dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                                                 causal: bool = False, window_size=(-1, -1),
                                                 alibi_slopes: Optional[Tensor] = None, deterministic: bool = False,
                                                 return_attn_probs: bool = False, group=None, *,
                                                 softcap: float = 0.0):
    """zigzag_ring_flash_attn_varlen_func with qkv (local total, 3, nheads, headdim)."""
    q, k, v = _args.unpack(qkv, "qkv", 3, 1)
    return _run("zigzag_ring_flash_attn_varlen_qkvpacked_func", "zigzag", q, k, v, cu_seqlens, max_seqlen,
                dropout_p, softmax_scale, causal, window_size, alibi_slopes, deterministic, return_attn_probs, group,
                softcap)
