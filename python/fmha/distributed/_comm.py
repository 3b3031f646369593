"""The transport: torch.distributed only (NCCL on GPUs, gloo on the CPU).

RingComm passes buffers to the next rank and receives from the previous one with
``dist.batch_isend_irecv``.  On a GPU the batch is issued from a dedicated stream, so the
transfer is ordered after the work that produced the buffers (that stream first waits on the
compute stream) but not after the kernels launched later on the compute stream: fmha's kernel
on the block in hand runs while the next block travels.  ``wait()`` makes the compute stream
wait for the transfer.  Every buffer involved stays referenced by the caller until after
``wait()``, and the compute stream waits on the transfer stream before any of them can be
freed, so the caching allocator never reuses memory still in flight.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import torch
import torch.distributed as dist

_STREAMS = {}


def _comm_stream(device: torch.device):
    if device.type != "cuda":
        return None
    key = device.index if device.index is not None else torch.cuda.current_device()
    if key not in _STREAMS:
        _STREAMS[key] = torch.cuda.Stream(device=key)
    return _STREAMS[key]


def group_rank_world(group) -> tuple:
    return dist.get_rank(group), dist.get_world_size(group)


class RingComm:
    def __init__(self, group, device: torch.device):
        self.group = group
        self.rank, self.world = group_rank_world(group)
        # Global ranks of the ring neighbours (isend/irecv take global ranks).
        nxt, prv = (self.rank + 1) % self.world, (self.rank - 1) % self.world
        if group is None or group is dist.group.WORLD:
            self.next, self.prev = nxt, prv
        else:
            self.next = dist.get_global_rank(group, nxt)
            self.prev = dist.get_global_rank(group, prv)
        self.stream = _comm_stream(device)
        self._reqs: List = []

    def send_recv(self, sends: Sequence[torch.Tensor]) -> List[torch.Tensor]:
        """Starts sending each tensor to the next rank and receiving a tensor of the same shape
        and dtype from the previous one; returns the receive buffers (valid after wait())."""
        recvs = [torch.empty_like(t) for t in sends]
        ops = [dist.P2POp(dist.isend, t, self.next, self.group) for t in sends]
        ops += [dist.P2POp(dist.irecv, t, self.prev, self.group) for t in recvs]
        if self.stream is not None:
            self.stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self.stream):
                self._reqs += dist.batch_isend_irecv(ops)
        else:
            self._reqs += dist.batch_isend_irecv(ops)
        return recvs

    def wait(self) -> None:
        if self.stream is not None:
            with torch.cuda.stream(self.stream):
                for r in self._reqs:
                    r.wait()
            torch.cuda.current_stream().wait_stream(self.stream)
        else:
            for r in self._reqs:
                r.wait()
        self._reqs = []


def _backend(group) -> str:
    try:
        return str(dist.get_backend(group)).lower()
    except Exception:  # pragma: no cover
        return ""


def all_gather(x: torch.Tensor, group, async_op: bool = False):
    """Concatenation over ranks along dim 0 (rank order): (out, work or None)."""
    _rank, world = group_rank_world(group)
    x = x.contiguous()
    out = torch.empty((world * x.shape[0],) + tuple(x.shape[1:]), dtype=x.dtype, device=x.device)
    if "nccl" in _backend(group):
        return out, dist.all_gather_into_tensor(out, x, group=group, async_op=async_op)
    work = dist.all_gather(list(out.chunk(world)), x, group=group, async_op=async_op)
    return out, work


def reduce_scatter(x: torch.Tensor, group) -> torch.Tensor:
    """Sum over ranks of x (world * n, ...), this rank's n rows."""
    rank, world = group_rank_world(group)
    x = x.contiguous()
    n = x.shape[0] // world
    if "nccl" in _backend(group):
        out = torch.empty((n,) + tuple(x.shape[1:]), dtype=x.dtype, device=x.device)
        dist.reduce_scatter_tensor(out, x, group=group)
        return out
    dist.all_reduce(x, group=group)  # gloo has no reduce-scatter
    return x[rank * n:(rank + 1) * n].clone()


def all_to_all(x: torch.Tensor, scatter_dim: int, gather_dim: int, group) -> torch.Tensor:
    """Splits x in W parts along scatter_dim, sends part i to rank i, and concatenates what
    arrives along gather_dim (rank order)."""
    _rank, world = group_rank_world(group)
    if world == 1:
        return x
    y = x.movedim(scatter_dim, 0).contiguous()  # all_to_all_single splits dim 0 (gloo has no all_to_all)
    out = torch.empty_like(y)
    dist.all_to_all_single(out, y, group=group)
    return torch.cat([p.movedim(0, scatter_dim) for p in out.chunk(world)], dim=gather_dim)


def wait(work: Optional[object]) -> None:
    if work is not None:
        work.wait()
