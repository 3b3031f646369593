"""Fixed-length ring attention in three layouts, ring-flash-attention's names and signatures:

- ``ring_flash_attn_func``: rank r holds tokens [r L, (r + 1) L) of each sequence;
- ``zigzag_ring_flash_attn_func``: rank r holds chunks r and 2W-1-r of 2W equal chunks
  (causal work balanced over ranks; shard with fmha.distributed.zigzag_shard);
- ``stripe_flash_attn_func``: token t on rank t % W (stripe_shard).

q, k, v are the local shards (batch, local seqlen, nheads(_k), headdim); the result is the
local rows of attention over the whole sequence (causal and windows in global positions).
"""

from __future__ import annotations

from typing import Optional

from torch import Tensor

from . import _args
from ._ring import FixedGeom, RingAttention


def _run(name, layout, q, k, v, dropout_p, softmax_scale, causal, window_size, alibi_slopes, deterministic,
         return_attn_probs, group, softcap):
    scale, softcap, left, right, _rank, world = _args.common(
        name, q, k, v, dropout_p, softmax_scale, causal, window_size, alibi_slopes, softcap, group)
    _args.fixed_shapes(name, q, k, v, 2 if layout == "zigzag" else 1, world)
    geom = FixedGeom(layout, q.shape[1], world, left, right)
    out, lse = RingAttention.apply(q, k, v, geom, scale, softcap, bool(deterministic), group)
    return _args.result(out, lse, return_attn_probs)


_DOC = """{what}

Arguments as flash_attn_func's, plus ``group`` (the process group, default WORLD) and the
keyword ``softcap``; dropout_p must be 0 and alibi_slopes None (ValueError otherwise).
Returns out, or (out, softmax_lse (batch, nheads, local seqlen), None) with
return_attn_probs; both differentiable."""


def ring_flash_attn_func(q: Tensor, k: Tensor, v: Tensor, dropout_p: float = 0.0,
                         softmax_scale: Optional[float] = None, causal: bool = False, window_size=(-1, -1),
                         alibi_slopes: Optional[Tensor] = None, deterministic: bool = False,
                         return_attn_probs: bool = False, group=None, *, softcap: float = 0.0):
    return _run("ring_flash_attn_func", "ring", q, k, v, dropout_p, softmax_scale, causal, window_size,
                alibi_slopes, deterministic, return_attn_probs, group, softcap)


def ring_flash_attn_kvpacked_func(q: Tensor, kv: Tensor, dropout_p: float = 0.0,
                                  softmax_scale: Optional[float] = None, causal: bool = False, window_size=(-1, -1),
                                  alibi_slopes: Optional[Tensor] = None, deterministic: bool = False,
                                  return_attn_probs: bool = False, group=None, *, softcap: float = 0.0):
    k, v = _args.unpack(kv, "kv", 2, 2)
    return _run("ring_flash_attn_kvpacked_func", "ring", q, k, v, dropout_p, softmax_scale, causal, window_size,
                alibi_slopes, deterministic, return_attn_probs, group, softcap)


def ring_flash_attn_qkvpacked_func(qkv: Tensor, dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                                   causal: bool = False, window_size=(-1, -1), alibi_slopes: Optional[Tensor] = None,
                                   deterministic: bool = False, return_attn_probs: bool = False, group=None, *,
                                   softcap: float = 0.0):
    q, k, v = _args.unpack(qkv, "qkv", 3, 2)
    return _run("ring_flash_attn_qkvpacked_func", "ring", q, k, v, dropout_p, softmax_scale, causal, window_size,
                alibi_slopes, deterministic, return_attn_probs, group, softcap)


def zigzag_ring_flash_attn_func(q: Tensor, k: Tensor, v: Tensor, dropout_p: float = 0.0,
                                softmax_scale: Optional[float] = None, causal: bool = False, window_size=(-1, -1),
                                alibi_slopes: Optional[Tensor] = None, deterministic: bool = False,
                                return_attn_probs: bool = False, group=None, *, softcap: float = 0.0):
    return _run("zigzag_ring_flash_attn_func", "zigzag", q, k, v, dropout_p, softmax_scale, causal, window_size,
                alibi_slopes, deterministic, return_attn_probs, group, softcap)


def zigzag_ring_flash_attn_kvpacked_func(q: Tensor, kv: Tensor, dropout_p: float = 0.0,
                                         softmax_scale: Optional[float] = None, causal: bool = False,
                                         window_size=(-1, -1), alibi_slopes: Optional[Tensor] = None,
                                         deterministic: bool = False, return_attn_probs: bool = False, group=None,
                                         *, softcap: float = 0.0):
    k, v = _args.unpack(kv, "kv", 2, 2)
    return _run("zigzag_ring_flash_attn_kvpacked_func", "zigzag", q, k, v, dropout_p, softmax_scale, causal,
                window_size, alibi_slopes, deterministic, return_attn_probs, group, softcap)


def zigzag_ring_flash_attn_qkvpacked_func(qkv: Tensor, dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                                          causal: bool = False, window_size=(-1, -1),
                                          alibi_slopes: Optional[Tensor] = None, deterministic: bool = False,
                                          return_attn_probs: bool = False, group=None, *, softcap: float = 0.0):
    q, k, v = _args.unpack(qkv, "qkv", 3, 2)
    return _run("zigzag_ring_flash_attn_qkvpacked_func", "zigzag", q, k, v, dropout_p, softmax_scale, causal,
                window_size, alibi_slopes, deterministic, return_attn_probs, group, softcap)


def stripe_flash_attn_func(q: Tensor, k: Tensor, v: Tensor, dropout_p: float = 0.0,
                           softmax_scale: Optional[float] = None, causal: bool = False, window_size=(-1, -1),
                           alibi_slopes: Optional[Tensor] = None, deterministic: bool = False,
                           return_attn_probs: bool = False, group=None, *, softcap: float = 0.0):
    return _run("stripe_flash_attn_func", "stripe", q, k, v, dropout_p, softmax_scale, causal, window_size,
                alibi_slopes, deterministic, return_attn_probs, group, softcap)


def stripe_flash_attn_kvpacked_func(q: Tensor, kv: Tensor, dropout_p: float = 0.0,
                                    softmax_scale: Optional[float] = None, causal: bool = False, window_size=(-1, -1),
                                    alibi_slopes: Optional[Tensor] = None, deterministic: bool = False,
                                    return_attn_probs: bool = False, group=None, *, softcap: float = 0.0):
    k, v = _args.unpack(kv, "kv", 2, 2)
    return _run("stripe_flash_attn_kvpacked_func", "stripe", q, k, v, dropout_p, softmax_scale, causal, window_size,
                alibi_slopes, deterministic, return_attn_probs, group, softcap)


def stripe_flash_attn_qkvpacked_func(qkv: Tensor, dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                                     causal: bool = False, window_size=(-1, -1), alibi_slopes: Optional[Tensor] = None,
                                     deterministic: bool = False, return_attn_probs: bool = False, group=None, *,
                                     softcap: float = 0.0):
    q, k, v = _args.unpack(qkv, "qkv", 3, 2)
    return _run("stripe_flash_attn_qkvpacked_func", "stripe", q, k, v, dropout_p, softmax_scale, causal,
                window_size, alibi_slopes, deterministic, return_attn_probs, group, softcap)


ring_flash_attn_func.__doc__ = _DOC.format(what="Ring attention, contiguous layout: rank r holds tokens "
                                                "[r L, (r + 1) L); q, k, v (batch, L, nheads(_k), headdim).")
zigzag_ring_flash_attn_func.__doc__ = _DOC.format(what="Ring attention, zigzag layout: rank r holds chunks r and "
                                                       "2W-1-r of 2W (L even); balances causal work.")
stripe_flash_attn_func.__doc__ = _DOC.format(what="Ring attention, stripe layout: local row i of rank r is token "
                                                  "i W + r.")
for _f in (ring_flash_attn_kvpacked_func, zigzag_ring_flash_attn_kvpacked_func, stripe_flash_attn_kvpacked_func):
    _f.__doc__ = "The matching function with kv (batch, L, 2, nheads_k, headdim)."
for _f in (ring_flash_attn_qkvpacked_func, zigzag_ring_flash_attn_qkvpacked_func, stripe_flash_attn_qkvpacked_func):
    _f.__doc__ = "The matching function with qkv (batch, L, 3, nheads, headdim)."
