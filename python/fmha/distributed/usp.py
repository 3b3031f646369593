"""Ulysses x ring (Unified Sequence Parallelism, as yunchang's LongContextAttention): the
ranks form a 2-D mesh, U ranks per Ulysses group and R per ring group (U R ranks in all).

The sequence is split in the ring's layout over the R ring positions, and each ring
position's rows again over the U ranks of its Ulysses group (usp_shard).  An all-to-all in
the Ulysses group gives each rank its ring position's rows for nheads / U heads; ring
attention over the ring group computes them against the whole sequence; a second all-to-all
returns the rank's own rows with every head.  The Ulysses all-to-alls move activations once
over the (typically faster, intra-node) Ulysses links; the ring's K/V transfers overlap its
kernels.  Heads need only divide by U, not by U R as Ulysses alone would need.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist
from torch import Tensor

from .. import flash_attn_interface as _fa
from . import _args
from ._plan import LAYOUTS
from ._ring import FixedGeom, RingAttention
from .sharding import positions
from .ulysses import _AllToAll


def _segments(layout: str) -> int:
    """Contiguous runs of a ring position's rows: zigzag holds two chunks, the others one."""
    return 2 if layout == "zigzag" else 1


def usp_positions(seqlen: int, ulysses_rank: int, ulysses_size: int, ring_rank: int, ring_size: int,
                  layout: str = "zigzag") -> Tensor:
    """Global positions of a rank's local rows: ring position `ring_rank`'s rows in `layout`
    over ring_size positions, and of each of their contiguous runs (two for zigzag) the
    ulysses_rank-th of ulysses_size equal pieces."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    segs = _segments(layout)
    if seqlen % (segs * ring_size * ulysses_size):
        raise ValueError(f"{layout}: the sequence length ({seqlen}) must be a multiple of "
                         f"{segs * ring_size * ulysses_size} ({segs} x ring size x Ulysses size)")
    rows = positions(seqlen, ring_rank, ring_size, layout)
    return rows.view(segs, ulysses_size, -1)[:, ulysses_rank].reshape(-1)


def usp_shard(x: Tensor, ulysses_rank: int, ulysses_size: int, ring_rank: int, ring_size: int,
              layout: str = "zigzag", dim: int = 1) -> Tensor:
    """A rank's local rows of x along dim (usp_positions)."""
    pos = usp_positions(x.shape[dim], ulysses_rank, ulysses_size, ring_rank, ring_size, layout)
    return x.index_select(dim, pos.to(x.device))


def _ring_order(x: Tensor, segs: int, ulysses: int, dim: int, inverse: bool = False) -> Tensor:
    """The all-to-all gathers the Ulysses ranks' rows rank after rank (piece u of every run,
    for u = 0 .. U-1); the ring wants each run whole.  Reorders one into the other along dim."""
    if segs == 1 or ulysses == 1:
        return x
    shape = list(x.shape)
    n = shape[dim] // (segs * ulysses)
    outer = (ulysses, segs) if not inverse else (segs, ulysses)
    y = x.reshape(shape[:dim] + list(outer) + [n] + shape[dim + 1:]).transpose(dim, dim + 1)
    return y.reshape(shape)


def usp_flash_attn_func(q: Tensor, k: Tensor, v: Tensor, dropout_p: float = 0.0,
                        softmax_scale: Optional[float] = None, causal: bool = False, window_size=(-1, -1),
                        alibi_slopes: Optional[Tensor] = None, deterministic: bool = False,
                        return_attn_probs: bool = False, ulysses_group=None, ring_group=None, *,
                        softcap: float = 0.0, layout: str = "zigzag"):
    """Attention of the local rows (batch, L, nheads(_k), headdim) over the whole sequence on a
    Ulysses x ring mesh; rows as usp_shard gives them.  nheads and nheads_k must be multiples
    of the Ulysses group's size; L a multiple of that size (twice it for zigzag).  Arguments
    otherwise as the ring functions' (dropout_p 0, no ALiBi; windows and causal in global
    positions); give ulysses_group, ring_group or both: a missing one is a group of one
    (ring_group=None: Ulysses alone, in usp's layout; ulysses_group=None: the ring alone), and
    neither raises ValueError.  Returns out, or (out, softmax_lse (batch, nheads, L), None) with
    return_attn_probs; both differentiable."""
    name = "usp_flash_attn_func"
    if layout not in LAYOUTS:
        raise ValueError(f"{name}: layout must be one of {LAYOUTS}, got {layout!r}")
    if ulysses_group is None and ring_group is None:
        raise ValueError(f"{name}: give ulysses_group or ring_group (or both); with neither, use "
                         f"ulysses_flash_attn_func or the ring functions")
    scale, softcap, left, right, _, _ = _args.common(name, q, k, v, dropout_p, softmax_scale, causal, window_size,
                                                     alibi_slopes, softcap, ring_group or ulysses_group)
    ulysses = 1 if ulysses_group is None else dist.get_world_size(ulysses_group)
    ring = 1 if ring_group is None else dist.get_world_size(ring_group)
    segs = _segments(layout)
    _args.fixed_shapes(name, q, k, v, segs * ulysses, ring)
    for n, x in (("nheads", q.shape[2]), ("nheads_k", k.shape[2])):
        if x % ulysses:
            raise ValueError(f"{name}: {n} ({x}) must be a multiple of the Ulysses group's size ({ulysses})")

    def gather(x):  # (B, L, H, D) -> (B, U L, H / U, D) in the ring's row order
        if ulysses == 1:
            return x
        return _ring_order(_AllToAll.apply(x, 2, 1, ulysses_group), segs, ulysses, 1)

    qh, kh, vh = (gather(x) for x in (q, k, v))
    if ring == 1:  # the ring's one position holds the whole sequence in order
        out, lse, _ = _fa.flash_attn_func(qh, kh, vh, 0.0, scale, False, (left, right), softcap, None,
                                          deterministic, return_attn_probs=True)
    else:
        geom = FixedGeom(layout, qh.shape[1], ring, left, right)
        out, lse = RingAttention.apply(qh, kh, vh, geom, scale, softcap, bool(deterministic), ring_group)
    if ulysses > 1:
        out = _AllToAll.apply(_ring_order(out, segs, ulysses, 1, inverse=True), 1, 2, ulysses_group)
        lse = _AllToAll.apply(_ring_order(lse, segs, ulysses, 2, inverse=True).contiguous(), 2, 1, ulysses_group)
    return _args.result(out, lse, return_attn_probs)


def usp_flash_attn_kvpacked_func(q: Tensor, kv: Tensor, dropout_p: float = 0.0,
                                 softmax_scale: Optional[float] = None, causal: bool = False, window_size=(-1, -1),
                                 alibi_slopes: Optional[Tensor] = None, deterministic: bool = False,
                                 return_attn_probs: bool = False, ulysses_group=None, ring_group=None, *,
                                 softcap: float = 0.0, layout: str = "zigzag"):
    """usp_flash_attn_func with kv (batch, L, 2, nheads_k, headdim)."""
    k, v = _args.unpack(kv, "kv", 2, 2)
    return usp_flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, alibi_slopes, deterministic,
                               return_attn_probs, ulysses_group, ring_group, softcap=softcap, layout=layout)


def usp_flash_attn_qkvpacked_func(qkv: Tensor, dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                                  causal: bool = False, window_size=(-1, -1), alibi_slopes: Optional[Tensor] = None,
                                  deterministic: bool = False, return_attn_probs: bool = False, ulysses_group=None,
                                  ring_group=None, *, softcap: float = 0.0, layout: str = "zigzag"):
    """usp_flash_attn_func with qkv (batch, L, 3, nheads, headdim)."""
    q, k, v = _args.unpack(qkv, "qkv", 3, 2)
    return usp_flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, alibi_slopes, deterministic,
                               return_attn_probs, ulysses_group, ring_group, softcap=softcap, layout=layout)


__all__ = ["usp_positions", "usp_shard", "usp_flash_attn_func", "usp_flash_attn_kvpacked_func",
           "usp_flash_attn_qkvpacked_func"]
