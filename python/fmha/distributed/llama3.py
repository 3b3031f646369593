"""Packed documents by all-gather (Llama 3's context parallelism), ring-flash-attention's names
and signatures.

The packed batch (all documents, cu_seqlens over the whole of it) is split into W equal
contiguous parts, rank r holding rows [r T/W, (r + 1) T/W).  ``llama3_flash_attn_prepare_cu_seqlens``
gives each rank the cu_seqlens of its rows and of the keys they need (from the start of the
first document that reaches into its part, to the end of its part when causal, or of its last
document when not) and that key range as a slice of the gathered rows.  The function then
all-gathers K and V, ``heads_k_stride`` key/value heads at a time (the next group's gather runs
while fmha computes the current one), and makes one varlen fmha call per group.  Bottom-right
alignment lines up each local document's queries with its keys, so causal sliding windows are
exact.  Backward: K/V gathered again per group, one fmha backward, and dK/dV reduce-scattered
(gloo, which has no reduce-scatter: all-reduce, then this rank's rows).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .. import ops as _ops
from . import _args
from ._comm import all_gather, reduce_scatter, wait
from ._ring import _no_rng


def llama3_flash_attn_prepare_cu_seqlens(cu_seqlens: Tensor, causal: bool, rank: int, world_size: int):
    """From the global cu_seqlens (int32, every document of the packed batch): (cu_seqlens_q,
    cu_seqlens_k, max_seqlen_q, max_seqlen_k, local_k_slice) for rank `rank`.  The total must
    be a multiple of world_size.  Reads cu_seqlens on the host."""
    cu = [int(x) for x in cu_seqlens.tolist()]
    total = cu[-1]
    if total % world_size:
        raise ValueError(f"the packed total ({total}) must be a multiple of world_size ({world_size})")
    part = total // world_size
    lo, hi = rank * part, (rank + 1) * part
    docs = [d for d in range(len(cu) - 1) if cu[d + 1] > lo and cu[d] < hi]
    k_lo = cu[docs[0]]
    k_hi = hi if causal else cu[docs[-1] + 1]
    cu_q = [max(cu[d], lo) - lo for d in docs] + [part]
    cu_k = [cu[d] - k_lo for d in docs] + [k_hi - k_lo]
    max_q = max(b - a for a, b in zip(cu_q[:-1], cu_q[1:]))
    max_k = max(b - a for a, b in zip(cu_k[:-1], cu_k[1:]))
    as_tensor = lambda x: torch.tensor(x, dtype=torch.int32, device=cu_seqlens.device)  # noqa: E731
    return as_tensor(cu_q), as_tensor(cu_k), max_q, max_k, slice(k_lo, k_hi)


def _gather_kv(k: Tensor, v: Tensor, h0: int, h1: int, group):
    """Start gathering heads [h0, h1) of K and V from every rank: ((W L, 2, h, D) buffer, work)."""
    return all_gather(torch.stack([k[:, h0:h1], v[:, h0:h1]], dim=1), group, async_op=True)


class Llama3Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, max_q, max_k, stride, kslice, scale, softcap, left, right,
                deterministic, group):
        hk = k.shape[1]
        g = q.shape[1] // hk
        outs, lses = [], []
        pending = _gather_kv(k, v, 0, stride, group)
        for h in range(0, hk, stride):
            buf, work = pending
            wait(work)
            if h + stride < hk:
                pending = _gather_kv(k, v, h + stride, h + 2 * stride, group)
            kb, vb = buf[kslice, 0], buf[kslice, 1]
            o, l, _, _ = _ops._fwd_impl(q[:, h * g:(h + stride) * g], kb, vb, cu_q, cu_k, None, max_q, max_k, scale,
                                        softcap, left, right, False, None, 0.0, False, False, None)
            outs.append(o)
            lses.append(l)
        out, lse = torch.cat(outs, dim=1), torch.cat(lses, dim=0)
        ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)
        ctx.args = (max_q, max_k, stride, kslice, scale, softcap, left, right, deterministic, group)
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
        max_q, max_k, stride, kslice, scale, softcap, left, right, deterministic, group = ctx.args
        if dout is None:
            dout = torch.zeros_like(out)
        hk = k.shape[1]
        g = q.shape[1] // hk
        dq = torch.empty_like(q)
        dk = torch.empty_like(k)
        dv = torch.empty_like(v)
        pending = _gather_kv(k, v, 0, stride, group)
        for h in range(0, hk, stride):
            buf, work = pending
            wait(work)
            if h + stride < hk:
                pending = _gather_kv(k, v, h + stride, h + 2 * stride, group)
            qh = slice(h * g, (h + stride) * g)
            dq_h, dk_h, dv_h = _ops._bwd_impl(
                dout[:, qh], q[:, qh], buf[kslice, 0], buf[kslice, 1], out[:, qh], lse[qh],
                None if dlse is None else dlse[qh], cu_q, cu_k, None, max_q, max_k, scale, softcap, left, right,
                False, None, 0.0, _no_rng(), deterministic)
            dq[:, qh] = dq_h
            dkv = torch.zeros(buf.shape, dtype=torch.float32, device=buf.device)
            dkv[kslice, 0] = dk_h
            dkv[kslice, 1] = dv_h
            dkv = reduce_scatter(dkv, group)
            dk[:, h:h + stride] = dkv[:, 0]
            dv[:, h:h + stride] = dkv[:, 1]
        return (dq, dk, dv) + (None,) * 12


def _run(name, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, heads_k_stride, local_k_slice,
         dropout_p, softmax_scale, causal, window_size, alibi_slopes, deterministic, return_attn_probs, group,
         softcap):
    scale, softcap, left, right, _rank, _world = _args.common(
        name, q, k, v, dropout_p, softmax_scale, causal, window_size, alibi_slopes, softcap, group)
    _args.varlen_shapes(name, q, k, v, cu_seqlens_q)
    if not causal and (left, right) != (-1, -1):
        raise ValueError(f"{name}: sliding windows need causal=True here (the last local document's queries end "
                         f"before its keys when not causal, so the window would be misaligned)")
    hk = k.shape[1]
    if isinstance(heads_k_stride, bool) or not isinstance(heads_k_stride, int) or heads_k_stride < 1 \
            or hk % heads_k_stride:
        raise ValueError(f"{name}: heads_k_stride must be a positive divisor of nheads_k ({hk}), got "
                         f"{heads_k_stride!r}")
    out, lse = Llama3Attention.apply(q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k),
                                     heads_k_stride, local_k_slice, scale, softcap, left, right,
                                     bool(deterministic), group)
    return _args.result(out, lse, return_attn_probs)


def llama3_flash_attn_varlen_func(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                                  max_seqlen_q: int, max_seqlen_k: int, heads_k_stride: int, local_k_slice: slice,
                                  dropout_p: float = 0.0, softmax_scale: Optional[float] = None, causal: bool = False,
                                  window_size=(-1, -1), alibi_slopes: Optional[Tensor] = None,
                                  deterministic: bool = False, return_attn_probs: bool = False, group=None, *,
                                  softcap: float = 0.0):
    """Attention of this rank's rows of a packed batch over every key they see, from
    llama3_flash_attn_prepare_cu_seqlens' results.  q (T/W, nheads, headdim), k, v (T/W,
    nheads_k, headdim).  Returns out, or (out, softmax_lse (nheads, T/W), None)."""
    return _run("llama3_flash_attn_varlen_func", q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                heads_k_stride, local_k_slice, dropout_p, softmax_scale, causal, window_size, alibi_slopes,
                deterministic, return_attn_probs, group, softcap)


def llama3_flash_attn_varlen_kvpacked_func(q: Tensor, kv: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                                           max_seqlen_q: int, max_seqlen_k: int, heads_k_stride: int,
                                           local_k_slice: slice, dropout_p: float = 0.0,
                                           softmax_scale: Optional[float] = None, causal: bool = False,
                                           window_size=(-1, -1), alibi_slopes: Optional[Tensor] = None,
                                           deterministic: bool = False, return_attn_probs: bool = False, group=None,
                                           *, softcap: float = 0.0):
    """llama3_flash_attn_varlen_func with kv (T/W, 2, nheads_k, headdim)."""
    k, v = _args.unpack(kv, "kv", 2, 1)
    return _run("llama3_flash_attn_varlen_kvpacked_func", q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                max_seqlen_k, heads_k_stride, local_k_slice, dropout_p, softmax_scale, causal, window_size,
                alibi_slopes, deterministic, return_attn_probs, group, softcap)


def llama3_flash_attn_varlen_qkvpacked_func(qkv: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                                            max_seqlen_q: int, max_seqlen_k: int, heads_k_stride: int,
                                            local_k_slice: slice, dropout_p: float = 0.0,
                                            softmax_scale: Optional[float] = None, causal: bool = False,
                                            window_size=(-1, -1), alibi_slopes: Optional[Tensor] = None,
                                            deterministic: bool = False, return_attn_probs: bool = False,
                                            group=None, *, softcap: float = 0.0):
    """llama3_flash_attn_varlen_func with qkv (T/W, 3, nheads, headdim)."""
    q, k, v = _args.unpack(qkv, "qkv", 3, 1)
    return _run("llama3_flash_attn_varlen_qkvpacked_func", q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                max_seqlen_k, heads_k_stride, local_k_slice, dropout_p, softmax_scale, causal, window_size,
                alibi_slopes, deterministic, return_attn_probs, group, softcap)
