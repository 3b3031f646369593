"""torch.nn.functional.scaled_dot_product_attention's signature and semantics on fmha."""

from __future__ import annotations

from typing import Optional

import torch

from . import _checks
from . import ops as _ops


def scaled_dot_product_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                 attn_mask: Optional[torch.Tensor] = None, dropout_p: float = 0.0, is_causal: bool = False,
                                 scale: Optional[float] = None, enable_gqa: bool = False) -> torch.Tensor:
    """Attention over (batch, heads, seqlen, headdim) tensors (or (heads, seqlen, headdim)),
    as torch.nn.functional.scaled_dot_product_attention computes it: is_causal is aligned to
    the top-left corner (query i sees keys 0..i), scale defaults to headdim ** -0.5, and
    enable_gqa lets query heads be a multiple of key/value heads.

    attn_mask tensors are not supported: fmha derives masks from geometry (is_causal here;
    windows, softcap and ALiBi through flash_attn_func).
    """
    if attn_mask is not None:
        raise ValueError("attn_mask is not supported by fmha.scaled_dot_product_attention; use is_causal, "
                         "or fmha.flash_attn_func's window_size / alibi_slopes")
    for name, x in (("query", query), ("key", key), ("value", value)):
        _checks._tensor(x, name)
        if x.dim() not in (3, 4):
            raise ValueError(f"{name} must be (batch, heads, seqlen, headdim) or (heads, seqlen, headdim), "
                             f"got shape {tuple(x.shape)}")
    if not query.dim() == key.dim() == value.dim():
        raise ValueError(f"query, key and value must have the same number of dims, got {query.dim()}, "
                         f"{key.dim()}, {value.dim()}")
    if value.shape[-1] != query.shape[-1]:
        raise ValueError(f"value's head dimension ({value.shape[-1]}) must equal query's ({query.shape[-1]})")
    if query.shape[-3] != key.shape[-3] and not enable_gqa:
        raise ValueError(f"query has {query.shape[-3]} heads and key {key.shape[-3]}: pass enable_gqa=True "
                         f"for grouped-query attention")
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal must be a bool, got {type(is_causal).__name__}")
    batched = query.dim() == 4
    q, k, v = (x if batched else x.unsqueeze(0) for x in (query, key, value))
    # (B, H, S, D) -> (B, S, H, D): a view; fmha takes any batch/row/head strides.
    q, k, v = (_checks.contiguous_last(x.transpose(1, 2)) for x in (q, k, v))
    if scale is None:
        scale = q.shape[-1] ** -0.5 if q.shape[-1] > 0 else 1.0
    out, _lse, _rng, _probs = _ops.attention(
        q, k, v, None, None, None, q.shape[1], k.shape[1], scale, 0.0, -1, 0 if is_causal else -1,
        True, None, dropout_p, False, False, None)
    out = out.transpose(1, 2)
    return out if batched else out.squeeze(0)
