"""Argument checks shared by the context-parallel functions."""

from __future__ import annotations

from typing import Tuple

import torch
import torch.distributed as dist

from .. import _checks


def common(name: str, q, k, v, dropout_p, softmax_scale, causal, window_size, alibi_slopes, softcap,
           group) -> Tuple[float, float, int, int, int, int]:
    """(scale, softcap, left, right, rank, world) after the checks every variant shares."""
    for n, x in (("q", q), ("k", k), ("v", v)):
        _checks._tensor(x, n)
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(f"{name}: torch.distributed is not initialized (call "
                           f"torch.distributed.init_process_group first)")
    if dropout_p != 0:
        raise ValueError(f"{name}: dropout_p must be 0, got {dropout_p}: fmha's dropout mask is keyed by "
                         f"positions within one kernel call, which are not the sequence's positions in a block")
    if alibi_slopes is not None:
        raise ValueError(f"{name}: alibi_slopes is not supported: the ALiBi distance would be measured within "
                         f"each block, not across the whole sequence")
    left, right = _checks.window(window_size, causal)
    softcap = _checks._float(softcap, "softcap")
    if softmax_scale is None:
        softmax_scale = q.shape[-1] ** -0.5 if q.shape[-1] > 0 else 1.0
    return float(softmax_scale), softcap, left, right, dist.get_rank(group), dist.get_world_size(group)


def fixed_shapes(name: str, q, k, v, multiple: int, world: int) -> None:
    for n, x in (("q", q), ("k", k), ("v", v)):
        if x.dim() != 4:
            raise ValueError(f"{name}: {n} must be 4-D (batch, local seqlen, nheads, headdim), got shape "
                             f"{tuple(x.shape)}")
    if k.shape[1] != q.shape[1] or v.shape[1] != q.shape[1]:
        raise ValueError(f"{name}: q, k and v must hold the same local tokens (self-attention over one sharded "
                         f"sequence), got local seqlens {q.shape[1]}, {k.shape[1]}, {v.shape[1]}")
    if q.shape[1] % multiple:
        raise ValueError(f"{name}: the local seqlen must be a multiple of {multiple} (the layout splits it into "
                         f"equal chunks), got {q.shape[1]}")


def varlen_shapes(name: str, q, k, v, cu_seqlens) -> None:
    for n, x in (("q", q), ("k", k), ("v", v)):
        if x.dim() != 3:
            raise ValueError(f"{name}: {n} must be 3-D (local total, nheads, headdim), got shape {tuple(x.shape)}")
    if k.shape[0] != q.shape[0] or v.shape[0] != q.shape[0]:
        raise ValueError(f"{name}: q, k and v must hold the same local tokens, got {q.shape[0]}, {k.shape[0]}, "
                         f"{v.shape[0]}")
    _checks._tensor(cu_seqlens, "cu_seqlens")
    if cu_seqlens.dtype != torch.int32 or cu_seqlens.dim() != 1:
        raise TypeError(f"{name}: cu_seqlens must be a 1-D torch.int32 tensor, got {cu_seqlens.dtype} of shape "
                        f"{tuple(cu_seqlens.shape)}")


def result(out, lse, return_attn_probs: bool):
    """What flash_attn returns: out, or (out, softmax_lse, None) (no probabilities)."""
    return (out, lse, None) if return_attn_probs else out


def unpack(x, name: str, count: int, dim: int):
    _checks._tensor(x, name)
    if x.dim() <= dim or x.shape[dim] != count:
        raise ValueError(f"{name} must have {count} at dim {dim}, got shape {tuple(x.shape)}")
    return x.unbind(dim)


def no_window(name: str, left: int, right: int, causal: bool) -> None:
    if left != -1 or (right != -1 and not (causal and right == 0)):
        raise ValueError(f"{name}: window_size must be (-1, -1) (sliding windows are supported by the fixed-length "
                         f"ring, zigzag and stripe functions and by llama3_flash_attn_varlen_func with causal=True)")
