"""The ring engine shared by ring, zigzag and stripe attention, fixed-length and varlen.

Forward, on rank r of W: K and V (packed into one buffer) go around the ring; at step t the
buffer of rank s = r - t is in hand while the next one travels (RingComm).  The block's calls
come from _plan; each is one fmha forward on a slice, with its own top-left window, and its
(out, lse) is merged into the running result by log-sum-exp in fp32 (merge_attentions'
math, in place on the rows the call covers; rows that saw nothing keep lse = -inf and out 0).

Backward: the same walk.  Each call is one fmha backward given the *global* out and LSE of
its rows (so P = exp(S - lse) is already the globally normalized probability, and dQ, dK, dV
of the block are exact contributions); dQ is summed here, and dK/dV (fp32) travel with the
K/V they belong to, one step behind, until they reach their owner.  The gradient of the
returned LSE is honoured (the kernel's dlse input, row for row).
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch
from torch import Tensor

from .. import ops as _ops
from . import _plan
from ._comm import RingComm

# Symbolic chunk length for varlen plans: every block boundary there is a chunk boundary
# (no windows), so a plan made on chunks of this length is every document's plan, scaled.
_C = 1024


class Sel:
    """A set of local rows: a slice (fixed length, or all of varlen), or an index (varlen)."""

    __slots__ = ("rows", "idx", "cu", "max_len", "n")

    def __init__(self, rows: slice, idx: Optional[Tensor], cu: Optional[Tensor], max_len: int, n: int):
        self.rows, self.idx, self.cu, self.max_len, self.n = rows, idx, cu, max_len, n

    def take(self, x: Tensor, dim: int) -> Tensor:
        if self.idx is not None:
            return x.index_select(dim, self.idx)
        return x.narrow(dim, self.rows.start, self.n)  # one call, where x[..., rows] built an index tuple

    def add_(self, acc: Tensor, dim: int, val: Tensor) -> None:
        if self.idx is not None:
            acc.index_add_(dim, self.idx, val.to(acc.dtype))
        else:
            acc.narrow(dim, self.rows.start, self.n).add_(val)

    def put_(self, acc: Tensor, dim: int, val: Tensor) -> None:
        if self.idx is not None:
            acc.index_copy_(dim, self.idx, val.to(acc.dtype))
        else:
            acc.narrow(dim, self.rows.start, self.n).copy_(val)


class FixedGeom:
    """q, k, v (B, L, H, D) on every rank, in one of _plan.LAYOUTS."""

    row_dim = 1

    def __init__(self, layout: str, local_len: int, world: int, left: int, right: int):
        self.layout, self.local_len, self.world, self.left, self.right = layout, local_len, world, left, right

    def calls(self, rank: int, src: int) -> List[Tuple[Sel, Sel, int, int]]:
        out = []
        for b in _plan.step_plan(self.layout, rank, src, self.world, self.local_len, self.left, self.right):
            out.append((Sel(slice(b.q0, b.q1), None, None, b.q1 - b.q0, b.q1 - b.q0),
                        Sel(slice(b.k0, b.k1), None, None, b.k1 - b.k0, b.k1 - b.k0), b.left, b.right))
        return out

    def covers_all(self, sel: Sel) -> bool:
        return sel.n == self.local_len


class VarlenGeom:
    """q (T, H, D), k, v (T, Hk, D), documents at local cu_seqlens (the same on every rank);
    each document's local rows are its 'ring' part (one chunk of W) or 'zigzag' chunks r and
    2W-1-r of 2W.  No windows (checked by the caller)."""

    row_dim = 0

    def __init__(self, layout: str, cu_seqlens: Tensor, max_seqlen: int, world: int, causal: bool):
        self.layout, self.world = layout, world
        self.left, self.right = -1, (0 if causal else -1)
        self.nseg = 2 if layout == "zigzag" else 1
        self.cu, self.max_seqlen = cu_seqlens, int(max_seqlen)
        self.cu_host = [int(x) for x in cu_seqlens.tolist()]
        self.total = self.cu_host[-1]
        lengths = [b - a for a, b in zip(self.cu_host[:-1], self.cu_host[1:])]
        if any(n % self.nseg for n in lengths):
            raise ValueError(f"zigzag varlen: every local sequence length must be even (chunks r and 2W-1-r of "
                             f"equal length), got local lengths {lengths}")
        self._sels = {}

    def _sel(self, a: int, b: int) -> Sel:
        """Chunks [a, b) of every document's local rows."""
        if (a, b) not in self._sels:
            if (a, b) == (0, self.nseg):
                s = Sel(slice(0, self.total), None, self.cu, self.max_seqlen, self.total)
            else:
                idx = []
                for lo, hi in zip(self.cu_host[:-1], self.cu_host[1:]):
                    c = (hi - lo) // self.nseg
                    idx.append(torch.arange(lo + a * c, lo + b * c))
                idx = torch.cat(idx).to(self.cu.device)
                cu = self.cu * (b - a) // self.nseg
                s = Sel(slice(None), idx, cu, -(-self.max_seqlen * (b - a) // self.nseg), idx.numel())
            self._sels[(a, b)] = s
        return self._sels[(a, b)]

    def calls(self, rank: int, src: int) -> List[Tuple[Sel, Sel, int, int]]:
        out = []
        for b in _plan.step_plan(self.layout, rank, src, self.world, self.nseg * _C, self.left, self.right):
            assert all(x % _C == 0 for x in (b.q0, b.q1, b.k0, b.k1))
            out.append((self._sel(b.q0 // _C, b.q1 // _C), self._sel(b.k0 // _C, b.k1 // _C), b.left, b.right))
        return out

    def covers_all(self, sel: Sel) -> bool:
        return sel.idx is None


_NO_RNG = None


def _no_rng() -> Tensor:
    global _NO_RNG
    if _NO_RNG is None:
        _NO_RNG = torch.zeros(2, dtype=torch.int64)
    return _NO_RNG


def block_fwd(q, k, v, qs: Sel, ks: Sel, left, right, scale, softcap, row_dim):
    """fmha's forward on one block: (out, lse) of the rows qs over the keys ks."""
    qb, kb, vb = qs.take(q, row_dim), ks.take(k, row_dim), ks.take(v, row_dim)
    out, lse, _, _ = _ops._fwd_impl(qb, kb, vb, qs.cu, ks.cu, None, qs.max_len, ks.max_len, scale, softcap,
                                    left, right, True, None, 0.0, False, False, None)
    return out, lse


def block_bwd(dout, q, k, v, out, lse, dlse, qs: Sel, ks: Sel, left, right, scale, softcap, deterministic,
              row_dim):
    """fmha's backward on one block, given the global out and LSE of its rows."""
    take_q = lambda x: None if x is None else qs.take(x, row_dim)  # noqa: E731
    take_l = lambda x: None if x is None else qs.take(x, -1)  # noqa: E731
    return _ops._bwd_impl(take_q(dout), take_q(q), ks.take(k, row_dim), ks.take(v, row_dim), take_q(out),
                          take_l(lse), take_l(dlse), qs.cu, ks.cu, None, qs.max_len, ks.max_len, scale, softcap,
                          left, right, True, None, 0.0, _no_rng(), deterministic)


def merge_(acc_out: Tensor, acc_lse: Tensor, sel: Sel, out: Tensor, lse: Tensor, row_dim: int) -> None:
    """acc[rows] <- the log-sum-exp combination of acc[rows] and (out, lse), in fp32; rows
    where both are empty (lse -inf) stay out 0, lse -inf.  The two weights sum to one, so the
    combination is one lerp towards the block's rows by its weight exp(lse - new): one pass
    over acc's rows in place, where a * w_old + out * w_new took four (and their temporaries).
    Six kernels in all: at 4k tokens per rank a rank's steps are bound by the host's launches
    (S = 32k, W = 8 on an H200), so the new LSE goes straight into acc's rows where they are a
    view, and rows where both are empty (weight exp(-inf - -inf) = NaN) get weight 0 in one pass."""
    a_lse = sel.take(acc_lse, -1)  # a view of acc's rows, or (index) a copy put back below
    new = torch.logaddexp(a_lse, lse, out=a_lse if sel.idx is None else None)
    w = (lse - new).exp_().nan_to_num_(0.0).transpose(-1, -2).unsqueeze(-1)
    a_out = sel.take(acc_out, row_dim)
    a_out.lerp_(out.float(), w)
    if sel.idx is not None:
        sel.put_(acc_out, row_dim, a_out)
        sel.put_(acc_lse, -1, new)


def _lse_shape(q: Tensor, row_dim: int) -> Tuple[int, ...]:
    return (q.shape[1], q.shape[0]) if row_dim == 0 else (q.shape[0], q.shape[2], q.shape[1])


def _pack(k: Tensor, v: Tensor) -> Tensor:
    return torch.cat([k.reshape(-1), v.reshape(-1)])


def _unpack(buf: Tensor, k: Tensor, v: Tensor) -> Tuple[Tensor, Tensor]:
    nk = k.numel()
    return buf[:nk].view(k.shape), buf[nk:].view(v.shape)


def ring_forward(q, k, v, geom, scale, softcap, group, comm=None) -> Tuple[Tensor, Tensor]:
    """(out, lse) of the local rows.  `comm`: the transport (RingComm on `group` unless given;
    the benchmark passes simulated ones)."""
    comm = comm if comm is not None else RingComm(group, q.device)
    world, rank, rd = comm.world, comm.rank, geom.row_dim
    acc_out = acc_lse = None
    kv = _pack(k, v) if world > 1 else None
    for t in range(world):
        src = (rank - t) % world
        nxt = comm.send_recv([kv])[0] if t + 1 < world else None
        kk, vv = (k, v) if t == 0 else _unpack(kv, k, v)
        for qs, ks, left, right in geom.calls(rank, src):
            o, l = block_fwd(q, kk, vv, qs, ks, left, right, scale, softcap, rd)
            if acc_out is None:
                if geom.covers_all(qs):
                    acc_out, acc_lse = o.float(), l.clone()
                    continue
                acc_out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
                acc_lse = torch.full(_lse_shape(q, rd), -torch.inf, dtype=torch.float32, device=q.device)
            merge_(acc_out, acc_lse, qs, o, l, rd)
        if nxt is not None:
            comm.wait()
            kv = nxt
    if acc_out is None:  # no row sees any key
        acc_out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        acc_lse = torch.full(_lse_shape(q, rd), -torch.inf, dtype=torch.float32, device=q.device)
    return acc_out.to(q.dtype), acc_lse


def ring_backward(dout, dlse, q, k, v, out, lse, geom, scale, softcap, deterministic, group, comm=None):
    comm = comm if comm is not None else RingComm(group, q.device)
    world, rank, rd = comm.world, comm.rank, geom.row_dim
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    nk = k.numel()
    kv = _pack(k, v) if world > 1 else None
    dkv_prev = None
    for t in range(world):
        src = (rank - t) % world
        sends = ([kv] if t + 1 < world else []) + ([dkv_prev] if t > 0 else [])
        recvs = comm.send_recv(sends) if sends else []
        kk, vv = (k, v) if t == 0 else _unpack(kv, k, v)
        dkv = torch.zeros(nk + v.numel(), dtype=torch.float32, device=q.device)
        dk, dv = dkv[:nk].view(k.shape), dkv[nk:].view(v.shape)
        for qs, ks, left, right in geom.calls(rank, src):
            dq_b, dk_b, dv_b = block_bwd(dout, q, kk, vv, out, lse, dlse, qs, ks, left, right, scale, softcap,
                                         deterministic, rd)
            qs.add_(dq, rd, dq_b)
            ks.add_(dk, rd, dk_b)
            ks.add_(dv, rd, dv_b)
        if sends:
            comm.wait()
        if t + 1 < world:
            kv = recvs[0]
        if t > 0:
            dkv += recvs[-1]  # what the ranks before this one added to this K/V's gradient
        dkv_prev = dkv
    if world > 1:
        dkv_prev = comm.send_recv([dkv_prev])[0]  # each K/V's full gradient to its owner
        comm.wait()
    dk, dv = dkv_prev[:nk].view(k.shape), dkv_prev[nk:].view(v.shape)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, geom, scale, softcap, deterministic, group):
        out, lse = ring_forward(q, k, v, geom, scale, softcap, group)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args = (geom, scale, softcap, deterministic, group)
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        geom, scale, softcap, deterministic, group = ctx.args
        if dout is None:
            dout = torch.zeros_like(out)
        dq, dk, dv = ring_backward(dout, dlse, q, k, v, out, lse, geom, scale, softcap, deterministic, group)
        return dq, dk, dv, None, None, None, None, None
