"""Ulysses (DeepSpeed-Ulysses) context parallelism: all-to-all over heads.

Each rank holds a contiguous part of the sequence with every head: rank r holds tokens
[r L, (r + 1) L) (as ring_flash_attn_func), or, for packed documents, rows
[r T / W, (r + 1) T / W) of the whole packed batch (as llama3_flash_attn_varlen_func;
documents may cross ranks).  An all-to-all turns that into the whole sequence (or batch) for
nheads / W heads, fmha.flash_attn_func (flash_attn_varlen_func, with the whole batch's
cu_seqlens) runs on it with every feature (windows, softcap, ALiBi with this rank's slopes,
GQA when nheads_k is also a multiple of W), and a second all-to-all returns the local rows
with every head.  Gradients flow back through the same all-to-alls (their backward is the
inverse all-to-all).  Communication is not overlapped with the kernel: the attention of a
head group needs the whole sequence.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .. import flash_attn_interface as _fa
from . import _args
from ._comm import all_to_all


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scatter_dim, gather_dim, group):
        ctx.args = (scatter_dim, gather_dim, group)
        return all_to_all(x, scatter_dim, gather_dim, group)

    @staticmethod
    def backward(ctx, grad):
        scatter_dim, gather_dim, group = ctx.args
        return all_to_all(grad.contiguous(), gather_dim, scatter_dim, group), None, None, None


def ulysses_flash_attn_func(q: Tensor, k: Tensor, v: Tensor, dropout_p: float = 0.0,
                            softmax_scale: Optional[float] = None, causal: bool = False, window_size=(-1, -1),
                            alibi_slopes: Optional[Tensor] = None, deterministic: bool = False,
                            return_attn_probs: bool = False, group=None, *, softcap: float = 0.0):
    """Attention of the local rows (batch, L, nheads, headdim) over the whole sequence, by
    all-to-all over heads; nheads and nheads_k must be multiples of the world size.  Returns
    out, or (out, softmax_lse (batch, nheads, L), None) with return_attn_probs.  dropout_p > 0
    is accepted; its mask is then drawn per rank (keyed by the rank's head index), so it is a
    valid dropout but not the single-process mask."""
    import torch.distributed as dist

    name = "ulysses_flash_attn_func"
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(f"{name}: torch.distributed is not initialized")
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    _args.fixed_shapes(name, q, k, v, 1, world)
    for n, x in (("nheads", q.shape[2]), ("nheads_k", k.shape[2])):
        if x % world:
            raise ValueError(f"{name}: {n} ({x}) must be a multiple of the world size ({world}): each rank "
                             f"computes nheads / W heads")
    if alibi_slopes is not None:
        hw = q.shape[2] // world
        alibi_slopes = alibi_slopes[..., rank * hw:(rank + 1) * hw].contiguous()
    qh, kh, vh = (_AllToAll.apply(x, 2, 1, group) for x in (q, k, v))
    out, lse, _ = _fa.flash_attn_func(qh, kh, vh, dropout_p, softmax_scale, causal, window_size, softcap,
                                      alibi_slopes, deterministic, return_attn_probs=True)
    out = _AllToAll.apply(out, 1, 2, group)
    if not return_attn_probs:
        return out
    return out, _AllToAll.apply(lse, 2, 1, group), None


def ulysses_flash_attn_qkvpacked_func(qkv: Tensor, dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                                      causal: bool = False, window_size=(-1, -1),
                                      alibi_slopes: Optional[Tensor] = None, deterministic: bool = False,
                                      return_attn_probs: bool = False, group=None, *, softcap: float = 0.0):
    """ulysses_flash_attn_func with qkv (batch, L, 3, nheads, headdim)."""
    q, k, v = _args.unpack(qkv, "qkv", 3, 2)
    return ulysses_flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, alibi_slopes,
                                   deterministic, return_attn_probs, group, softcap=softcap)


def ulysses_flash_attn_kvpacked_func(q: Tensor, kv: Tensor, dropout_p: float = 0.0,
                                     softmax_scale: Optional[float] = None, causal: bool = False,
                                     window_size=(-1, -1), alibi_slopes: Optional[Tensor] = None,
                                     deterministic: bool = False, return_attn_probs: bool = False, group=None, *,
                                     softcap: float = 0.0):
    """ulysses_flash_attn_func with kv (batch, L, 2, nheads_k, headdim)."""
    k, v = _args.unpack(kv, "kv", 2, 2)
    return ulysses_flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, alibi_slopes,
                                   deterministic, return_attn_probs, group, softcap=softcap)


def _varlen_checks(name: str, q, k, v, cu_seqlens, max_seqlen, world: int) -> int:
    """The whole batch's total rows after the checks the varlen functions add."""
    _args.varlen_shapes(name, q, k, v, cu_seqlens)
    for n, x in (("nheads", q.shape[1]), ("nheads_k", k.shape[1])):
        if x % world:
            raise ValueError(f"{name}: {n} ({x}) must be a multiple of the world size ({world}): each rank "
                             f"computes nheads / W heads")
    if cu_seqlens.numel() < 1:
        raise ValueError(f"{name}: cu_seqlens must have batch + 1 >= 1 entries")
    total = int(cu_seqlens[-1])  # one device read, as flash_attn_varlen_func's own checks do
    if total != world * q.shape[0]:
        raise ValueError(f"{name}: cu_seqlens describes the whole packed batch: its last entry ({total}) must be "
                         f"the world size times the local rows ({world} x {q.shape[0]} = {world * q.shape[0]})")
    if not isinstance(max_seqlen, int) or max_seqlen < 0:
        raise TypeError(f"{name}: max_seqlen must be a non-negative int (the longest document), got {max_seqlen!r}")
    return total


def ulysses_flash_attn_varlen_func(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, max_seqlen: int,
                                   dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                                   causal: bool = False, window_size=(-1, -1), alibi_slopes: Optional[Tensor] = None,
                                   deterministic: bool = False, return_attn_probs: bool = False, group=None, *,
                                   softcap: float = 0.0):
    """Attention of this rank's rows of a packed batch of documents, by all-to-all over
    heads.  q (T/W, nheads, headdim), k, v (T/W, nheads_k, headdim) are rows
    [r T/W, (r + 1) T/W) of the whole batch (llama3_flash_attn_varlen_func's sharding:
    documents may cross ranks); cu_seqlens (batch + 1,) int32 and max_seqlen describe the
    whole batch, the same on every rank.  nheads and nheads_k must be multiples of the world
    size.  Every mask flash_attn_varlen_func takes (windows, softcap, ALiBi).  Returns out,
    or (out, softmax_lse (nheads, T/W), None) with return_attn_probs; dropout as in
    ulysses_flash_attn_func."""
    import torch.distributed as dist

    name = "ulysses_flash_attn_varlen_func"
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(f"{name}: torch.distributed is not initialized")
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    _varlen_checks(name, q, k, v, cu_seqlens, max_seqlen, world)
    if alibi_slopes is not None:
        hw = q.shape[1] // world
        alibi_slopes = alibi_slopes[..., rank * hw:(rank + 1) * hw].contiguous()
    qh, kh, vh = (_AllToAll.apply(x, 1, 0, group) for x in (q, k, v))  # (T, nheads / W, headdim)
    out, lse, _ = _fa.flash_attn_varlen_func(qh, kh, vh, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p,
                                             softmax_scale, causal, window_size, softcap, alibi_slopes,
                                             deterministic, return_attn_probs=True)
    out = _AllToAll.apply(out, 0, 1, group)
    if not return_attn_probs:
        return out
    return out, _AllToAll.apply(lse, 1, 0, group), None


def ulysses_flash_attn_varlen_qkvpacked_func(qkv: Tensor, cu_seqlens: Tensor, max_seqlen: int,
                                             dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                                             causal: bool = False, window_size=(-1, -1),
                                             alibi_slopes: Optional[Tensor] = None, deterministic: bool = False,
                                             return_attn_probs: bool = False, group=None, *, softcap: float = 0.0):
    """ulysses_flash_attn_varlen_func with qkv (T/W, 3, nheads, headdim)."""
    q, k, v = _args.unpack(qkv, "qkv", 3, 1)
    return ulysses_flash_attn_varlen_func(q, k, v, cu_seqlens, max_seqlen, dropout_p, softmax_scale, causal,
                                          window_size, alibi_slopes, deterministic, return_attn_probs, group,
                                          softcap=softcap)


def ulysses_flash_attn_varlen_kvpacked_func(q: Tensor, kv: Tensor, cu_seqlens: Tensor, max_seqlen: int,
                                            dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                                            causal: bool = False, window_size=(-1, -1),
                                            alibi_slopes: Optional[Tensor] = None, deterministic: bool = False,
                                            return_attn_probs: bool = False, group=None, *, softcap: float = 0.0):
    """ulysses_flash_attn_varlen_func with kv (T/W, 2, nheads_k, headdim)."""
    k, v = _args.unpack(kv, "kv", 2, 1)
    return ulysses_flash_attn_varlen_func(q, k, v, cu_seqlens, max_seqlen, dropout_p, softmax_scale, causal,
                                          window_size, alibi_slopes, deterministic, return_attn_probs, group,
                                          softcap=softcap)
