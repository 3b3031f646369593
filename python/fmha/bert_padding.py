"""Moving between padded (batch, seqlen, ...) tensors and the packed (total, ...) layout
of the varlen functions, as flash_attn.bert_padding does (2.7+ signatures)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def unpad_input(hidden_states, attention_mask, unused_mask=None):
    """Packs the tokens that attention_mask (batch, seqlen; nonzero = keep) selects.

    unused_mask (optional, same shape) marks tokens that are packed but not attended to
    (e.g. padding kept in place); they count in cu_seqlens but not in seqused.

    Returns (hidden_states (total, ...), indices (total,) into the flattened batch * seqlen,
    cu_seqlens (batch + 1,) int32, max_seqlen_in_batch (int), seqused (batch,) int32).
    """
    keep = attention_mask if unused_mask is None else attention_mask + unused_mask
    seqlens = keep.sum(dim=-1, dtype=torch.int32)
    used = attention_mask.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(keep.flatten(), as_tuple=False).flatten()
    max_seqlen = int(seqlens.max().item()) if seqlens.numel() else 0
    cu_seqlens = F.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
    flat = hidden_states.reshape(-1, *hidden_states.shape[2:])
    return flat[indices], indices, cu_seqlens, max_seqlen, used


def pad_input(hidden_states, indices, batch, seqlen):
    """Inverse of unpad_input: (total, ...) -> (batch, seqlen, ...), zeros where no token."""
    out = hidden_states.new_zeros((batch * seqlen, *hidden_states.shape[1:]))
    out = out.index_put((indices,), hidden_states)
    return out.reshape(batch, seqlen, *hidden_states.shape[1:])
