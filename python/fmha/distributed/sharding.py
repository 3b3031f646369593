"""Splitting a batch over ranks in the layouts the ring functions take, and putting it back.

layout "ring": rank r holds tokens [r L, (r + 1) L); "zigzag": chunks r and 2W-1-r of 2W
equal chunks; "stripe": token t on rank t % W.  Every function here is differentiable (index
selects and concatenations).
"""

from __future__ import annotations

from typing import List, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

from ._plan import LAYOUTS


def positions(seqlen: int, rank: int, world_size: int, layout: str = "zigzag") -> Tensor:
    """The global positions of rank `rank`'s local rows, in local order (int64)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    parts = 2 * world_size if layout == "zigzag" else world_size
    if seqlen % parts:
        raise ValueError(f"{layout}: the sequence length ({seqlen}) must be a multiple of {parts}")
    if layout == "ring":
        n = seqlen // world_size
        return torch.arange(rank * n, (rank + 1) * n)
    if layout == "stripe":
        return torch.arange(rank, seqlen, world_size)
    c = seqlen // parts
    return torch.cat([torch.arange(rank * c, (rank + 1) * c),
                      torch.arange((parts - 1 - rank) * c, (parts - rank) * c)])


def shard(x: Tensor, rank: int, world_size: int, layout: str = "zigzag", dim: int = 1) -> Tensor:
    """Rank `rank`'s local rows of x along dim (the sequence dim: 1 for (batch, seqlen, ...))."""
    return x.index_select(dim, positions(x.shape[dim], rank, world_size, layout).to(x.device))


def unshard(parts: Sequence[Tensor], layout: str = "zigzag", dim: int = 1) -> Tensor:
    """The whole sequence from every rank's local rows (parts[r] from rank r)."""
    world = len(parts)
    seqlen = sum(p.shape[dim] for p in parts)
    order = torch.cat([positions(seqlen, r, world, layout) for r in range(world)])
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(seqlen)
    return torch.cat(list(parts), dim=dim).index_select(dim, inverse.to(parts[0].device))


def zigzag_shard(x: Tensor, rank: int, world_size: int, dim: int = 1) -> Tensor:
    """Chunks rank and 2 world_size - 1 - rank of 2 world_size equal chunks of x along dim."""
    return shard(x, rank, world_size, "zigzag", dim)


def zigzag_unshard(parts: Sequence[Tensor], dim: int = 1) -> Tensor:
    """The inverse of zigzag_shard over every rank's part."""
    return unshard(parts, "zigzag", dim)


def stripe_shard(x: Tensor, rank: int, world_size: int, dim: int = 1) -> Tensor:
    return shard(x, rank, world_size, "stripe", dim)


def gather_unshard(local: Tensor, layout: str = "zigzag", dim: int = 1, group=None) -> Tensor:
    """All-gathers every rank's local rows and returns the whole sequence (not differentiable)."""
    world = dist.get_world_size(group)
    parts = [torch.empty_like(local) for _ in range(world)]
    dist.all_gather(parts, local.contiguous(), group=group)
    return unshard(parts, layout, dim)


def varlen_positions(cu_seqlens: Sequence[int], rank: int, world_size: int, layout: str = "zigzag") -> Tensor:
    """Global rows of rank `rank`'s local rows when every document of a packed batch is split
    in `layout` (ring or zigzag)."""
    if layout not in ("ring", "zigzag"):
        raise ValueError(f"varlen layouts are 'ring' and 'zigzag', got {layout!r}")
    cu = [int(c) for c in cu_seqlens]
    return torch.cat([positions(b - a, rank, world_size, layout) + a for a, b in zip(cu[:-1], cu[1:])])


def shard_varlen(x: Tensor, cu_seqlens: Tensor, rank: int, world_size: int, layout: str = "zigzag"
                 ) -> Tuple[Tensor, Tensor, int]:
    """Rank `rank`'s rows of a packed batch x (total, ...) whose documents are at cu_seqlens,
    with the local cu_seqlens (int32, on cu_seqlens' device) and local max_seqlen that
    ring_flash_attn_varlen_func / zigzag_ring_flash_attn_varlen_func take."""
    cu = [int(c) for c in cu_seqlens.tolist()]
    local = x.index_select(0, varlen_positions(cu, rank, world_size, layout).to(x.device))
    lengths = [(b - a) // world_size for a, b in zip(cu[:-1], cu[1:])]
    local_cu = torch.tensor([0] + lengths, dtype=torch.int32, device=cu_seqlens.device).cumsum(0, dtype=torch.int32)
    return local, local_cu, max(lengths, default=0)


def unshard_varlen(parts: Sequence[Tensor], cu_seqlens: Tensor, layout: str = "zigzag") -> Tensor:
    """The packed batch from every rank's rows (the inverse of shard_varlen)."""
    world = len(parts)
    cu = [int(c) for c in cu_seqlens.tolist()]
    order = torch.cat([varlen_positions(cu, r, world, layout) for r in range(world)])
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel())
    return torch.cat(list(parts), dim=0).index_select(0, inverse.to(parts[0].device))


__all__: List[str] = ["positions", "shard", "unshard", "zigzag_shard", "zigzag_unshard", "stripe_shard",
                      "gather_unshard", "varlen_positions", "shard_varlen", "unshard_varlen"]
