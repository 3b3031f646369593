"""The context-parallel suite (--suites context_parallel): zigzag ring attention
(fmha.distributed), causal, against fmha on one device over the whole sequence.

Per case (S tokens in total over W ranks, each rank holding S / W):

- ``ring``: time of one rank's ring attention (its W block steps, K/V passed around, LSE
  merges), the slowest rank;
- ``compute``: the same rank's calls with no transfer at all (each step reuses its own K/V
  buffer; the block plans depend only on the ranks, so the kernels do the same work);
- ``comm``: the W - 1 transfers of the K/V buffer alone;
- ``single``: fmha's one call over the whole sequence on one device.

``efficiency`` = per-device throughput of the ring (the sequence's FLOPs / W / ring) divided
by fmha's throughput on the whole sequence on one device (FLOPs / single): 1.0 means W
devices are W times faster.  ``overlap`` = compute / ring (1.0: transfers and merges cost
nothing).  ``hidden`` = the part of ``comm`` that does not show in ``ring``:
(compute + comm - ring) / comm, clipped to [0, 1].

With two or more GPUs visible the ring runs on them (one process per GPU, NCCL, spawned by
the suite).  Otherwise it is *simulated*, and labelled so: the ranks run one after another
on the one device, each timed alone, and a transfer is a device-to-device copy of the K/V
buffer on a side stream (the copy crosses HBM, not a link between GPUs, so ``comm`` and
``hidden`` say nothing about NVLink).  The simulated forward's output (K/V handed on in ring
order) is checked against the single call before any time is reported.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import tempfile
from typing import List, Optional

import torch

from . import timing


@dataclasses.dataclass(frozen=True)
class CPCase:
    seqlen: int       # total tokens over all ranks
    world: int
    heads: int
    head_dim: int
    dtype: torch.dtype
    causal: bool = True
    layout: str = "zigzag"

    def label(self) -> str:
        return f"S={self.seqlen} W={self.world} H={self.heads} D={self.head_dim}"

    def flops_fwd(self) -> float:
        f = 4.0 * self.seqlen * self.seqlen * self.heads * self.head_dim
        return f / 2 if self.causal else f


def cases(device: torch.device, quick: bool, dtype: torch.dtype, world: Optional[int] = None,
          seqlens: Optional[List[int]] = None) -> List[CPCase]:
    """D = 128, causal, S from 32k to 1M tokens in total (32k and 128k with --quick) on a
    GPU, over every visible GPU (8 simulated ranks with one); tiny shapes on the CPU.
    `seqlens` (--seqlens) replaces the default lengths; zigzag needs each a multiple of 2W."""
    if device.type == "cuda":
        w = world or (torch.cuda.device_count() if torch.cuda.device_count() >= 2 else 8)
        default = (32768, 131072) if quick else (32768, 65536, 131072, 262144, 524288, 1048576)
        heads, head_dim = 8, 128
    else:
        w = world or 2
        default = (256,) if quick else (256, 512)
        heads, head_dim = 2, 32
    for s in seqlens or ():
        if s <= 0 or s % (2 * w):
            raise ValueError(f"--seqlens: the context-parallel suite splits each sequence into {2 * w} equal zigzag "
                             f"chunks ({w} ranks), so every length must be a positive multiple of {2 * w}; got {s}")
    return [CPCase(s, w, heads, head_dim, dtype) for s in (seqlens or default)]


# --- simulated transports (one device) ----------------------------------------------------


class _SimComm:
    """RingComm's interface for rank `rank` simulated on one device.  With kv_all (every
    rank's packed K/V) the buffer received at step t is rank r - t - 1's, as on a real ring;
    without, a copy of what is sent (the same bytes moved, for timing).  null=True moves
    nothing (the compute-only run)."""

    def __init__(self, rank: int, world: int, device: torch.device, kv_all=None, null: bool = False):
        self.rank, self.world, self.kv_all, self.null, self.t = rank, world, kv_all, null, 0
        self.stream = torch.cuda.Stream(device=device) if device.type == "cuda" and not null else None

    def send_recv(self, sends):
        if self.null:
            return list(sends)
        self.t += 1
        if self.stream is not None:
            self.stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self.stream):
                return [self._recv(x) for x in sends]
        return [self._recv(x) for x in sends]

    def _recv(self, x):
        if self.kv_all is not None:
            return self.kv_all[(self.rank - self.t) % self.world].clone()
        return x.clone()

    def wait(self):
        if self.stream is not None:
            torch.cuda.current_stream().wait_stream(self.stream)


def _inputs(case: CPCase, device, gen_seed: int = 0):
    torch.manual_seed(gen_seed)
    shape = (1, case.seqlen, case.heads, case.head_dim)
    return [torch.randn(shape, device=device, dtype=case.dtype) for _ in range(4)]


def _simulated(case: CPCase, device, modes, budget) -> List[dict]:
    import fmha
    from fmha.distributed import _ring
    from fmha.distributed.sharding import shard

    q, k, v, do = _inputs(case, device)
    W, L = case.world, case.seqlen // case.world
    scale = case.head_dim ** -0.5
    loc = [[shard(x, r, W, case.layout) for x in (q, k, v, do)] for r in range(W)]
    geom = _ring.FixedGeom(case.layout, L, W, -1, 0 if case.causal else -1)

    # Check: every simulated rank's output against the single call on the whole sequence.
    single_out = fmha.flash_attn_func(q, k, v, causal=case.causal)
    kv_all = [_ring._pack(lk, lv) for _, lk, lv, _ in loc]
    num = den = 0.0
    for r in range(W):
        o, _ = _ring.ring_forward(*loc[r][:3], geom, scale, 0.0, None, comm=_SimComm(r, W, device, kv_all))
        ref = shard(single_out, r, W, case.layout).float()
        num += (o.float() - ref).norm().item() ** 2
        den += ref.norm().item() ** 2
    rel_err = (num / max(den, 1e-30)) ** 0.5
    del kv_all, single_out

    rows = []
    for mode in modes:
        bwd = mode == "fwd_bwd"
        per_rank = {"ring": [], "compute": []}
        for r in range(W):
            lq, lk, lv, ldo = loc[r]

            def call(null, r=r, lq=lq, lk=lk, lv=lv, ldo=ldo):
                comm = _SimComm(r, W, device, null=null)
                out, lse = _ring.ring_forward(lq, lk, lv, geom, scale, 0.0, None, comm=comm)
                if bwd:
                    _ring.ring_backward(ldo, None, lq, lk, lv, out, lse, geom, scale, 0.0, False, None,
                                        comm=_SimComm(r, W, device, null=null))

            per_rank["ring"].append(timing.median_ms([lambda: call(False)], device, warmup=1, min_runs=3,
                                                     budget_s=budget))
            per_rank["compute"].append(timing.median_ms([lambda: call(True)], device, warmup=1, min_runs=3,
                                                        budget_s=budget))
        kv = _ring._pack(loc[0][1], loc[0][2])
        sends = 2 if bwd else 1  # the backward also moves the fp32 dK/dV: counted as two K/V copies

        def transfers():
            comm = _SimComm(0, W, device)
            for _ in range((W - 1) * sends):
                comm.send_recv([kv])
            comm.wait()

        comm_ms = timing.median_ms([transfers], device, warmup=1, min_runs=3, budget_s=budget)

        def single():
            qq, kk, vv = (x.requires_grad_(bwd) for x in (q, k, v))
            out = fmha.flash_attn_func(qq, kk, vv, causal=case.causal)
            if bwd:
                torch.autograd.grad(out, (qq, kk, vv), do)

        single_ms = timing.median_ms([single], device, warmup=1, min_runs=3, budget_s=budget)
        for x in (q, k, v):
            x.requires_grad_(False)
        rows.append(_row(case, mode, True, max(per_rank["ring"]), max(per_rank["compute"]), comm_ms, single_ms,
                         rel_err, per_rank))
    return rows


def _row(case, mode, simulated, ring_ms, compute_ms, comm_ms, single_ms, rel_err, per_rank=None) -> dict:
    flops = case.flops_fwd() * (3.5 if mode == "fwd_bwd" else 1.0)
    hidden = None
    if comm_ms > 0:
        hidden = min(1.0, max(0.0, (compute_ms + comm_ms - ring_ms) / comm_ms))
    row = {"suite": "context_parallel", "case": case.label(), "mode": mode, "seqlen": case.seqlen,
           "world": case.world, "heads": case.heads, "head_dim": case.head_dim, "layout": case.layout,
           "causal": case.causal, "dtype": str(case.dtype).replace("torch.", ""), "simulated": simulated,
           "ms": {"ring": ring_ms, "compute": compute_ms, "comm": comm_ms, "single": single_ms},
           "tflops_per_device": flops / case.world / (ring_ms * 1e-3) / 1e12,
           "tflops_single": flops / (single_ms * 1e-3) / 1e12,
           "efficiency": single_ms / (case.world * ring_ms), "overlap": compute_ms / ring_ms, "hidden": hidden,
           "rel_err": rel_err}
    if per_rank:
        row["per_rank_ms"] = per_rank
    return row


# --- real multi-GPU run ----------------------------------------------------------------


def _rank_main(rank: int, world: int, port: int, specs: list, modes: list, budget: float, out_path: str):
    import torch.distributed as dist

    import fmha
    from fmha.distributed import _ring
    from fmha.distributed._comm import RingComm
    from fmha.distributed.sharding import shard

    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    rows = []
    for spec in specs:
        case = CPCase(spec["seqlen"], world, spec["heads"], spec["head_dim"], getattr(torch, spec["dtype"]))
        q, k, v, do = _inputs(case, device)  # same seed on every rank: the same global tensors
        L = case.seqlen // world
        lq, lk, lv, ldo = (shard(x, rank, world, case.layout) for x in (q, k, v, do))
        geom = _ring.FixedGeom(case.layout, L, world, -1, 0)
        scale = case.head_dim ** -0.5
        o, _ = _ring.ring_forward(lq, lk, lv, geom, scale, 0.0, None)
        ref = shard(fmha.flash_attn_func(q, k, v, causal=True), rank, world, case.layout) if rank == 0 else None
        rel_err = ((o.float() - ref.float()).norm() / ref.float().norm()).item() if rank == 0 else 0.0
        del ref
        for mode in modes:
            bwd = mode == "fwd_bwd"

            def call(null):
                comm = _SimComm(rank, world, device, null=True) if null else None
                out, lse = _ring.ring_forward(lq, lk, lv, geom, scale, 0.0, None, comm=comm)
                if bwd:
                    comm = _SimComm(rank, world, device, null=True) if null else None
                    _ring.ring_backward(ldo, None, lq, lk, lv, out, lse, geom, scale, 0.0, False, None, comm=comm)

            kv = _ring._pack(lk, lv)

            def transfers():
                comm = RingComm(None, device)
                for _ in range((world - 1) * (2 if bwd else 1)):
                    comm.send_recv([kv])
                    comm.wait()

            t = {}
            for name, fn in (("ring", lambda: call(False)), ("compute", lambda: call(True)), ("comm", transfers)):
                dist.barrier()
                t[name] = timing.median_ms([fn], device, warmup=1, min_runs=3, budget_s=budget)
            times = torch.tensor([t["ring"], t["compute"], t["comm"]], device=device)
            dist.all_reduce(times, op=dist.ReduceOp.MAX)
            if rank == 0:
                def single():
                    qq, kk, vv = (x.detach().requires_grad_(bwd) for x in (q, k, v))
                    out = fmha.flash_attn_func(qq, kk, vv, causal=True)
                    if bwd:
                        torch.autograd.grad(out, (qq, kk, vv), do)

                single_ms = timing.median_ms([single], device, warmup=1, min_runs=3, budget_s=budget)
                rows.append(_row(case, mode, False, *times.tolist(), single_ms, rel_err))
            dist.barrier()
        del q, k, v, do
        torch.cuda.empty_cache()
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(rows, f)
    dist.destroy_process_group()


def _multi_gpu(case_list: List[CPCase], modes, budget) -> List[dict]:
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out_path = os.path.join(tempfile.mkdtemp(prefix="fmha_cp_"), "rows.json")
    specs = [{"seqlen": c.seqlen, "heads": c.heads, "head_dim": c.head_dim,
              "dtype": str(c.dtype).replace("torch.", "")} for c in case_list]
    world = case_list[0].world
    mp.spawn(_rank_main, args=(world, port, specs, list(modes), budget, out_path), nprocs=world, join=True)
    with open(out_path) as f:
        return json.load(f)


def run(device: torch.device, quick: bool, dtype: torch.dtype, modes, budget: float,
        world: Optional[int] = None, seqlens: Optional[List[int]] = None) -> List[dict]:
    """Every case's rows (see the module's docstring)."""
    case_list = cases(device, quick, dtype, world, seqlens)
    if device.type == "cuda" and torch.cuda.device_count() >= 2 and case_list[0].world >= 2:
        return _multi_gpu(case_list, modes, budget)
    rows = []
    for case in case_list:
        rows += _simulated(case, device, modes, budget)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def _table_rows(payload):
    rows_in = [r for r in payload["results"] if r["suite"] == "context_parallel"]
    header = ["case", "mode", "ring", "ring ms", "compute ms", "comm ms", "single ms", "TFLOP/s per device",
              "efficiency", "overlap", "comm hidden"]
    rows = []
    for r in rows_in:
        ms = r["ms"]
        rows.append([r["case"], r["mode"], "simulated on one device" if r["simulated"] else f"{r['world']} GPUs",
                     f"{ms['ring']:.3g}", f"{ms['compute']:.3g}", f"{ms['comm']:.3g}", f"{ms['single']:.3g}",
                     f"{r['tflops_per_device']:.3g}", f"{r['efficiency']:.2f}", f"{r['overlap']:.2f}",
                     "-" if r["hidden"] is None else f"{r['hidden']:.2f}"])
    return header, rows


def terminal(payload) -> str:
    header, rows = _table_rows(payload)
    if not rows:
        return ""
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    fmt = lambda row: "  ".join(str(x).ljust(w) for x, w in zip(row, widths))  # noqa: E731
    return "\n".join(["Context parallel (zigzag ring, causal)", fmt(header)] + [fmt(r) for r in rows])


def markdown(payload) -> str:
    header, rows = _table_rows(payload)
    if not rows:
        return ""
    lines = ["## Context parallel: zigzag ring attention (fmha.distributed), causal", "",
             "efficiency = per-device throughput of the ring / fmha's throughput on the whole sequence on one "
             "device; overlap = compute / ring; comm hidden = (compute + comm - ring) / comm. Simulated rows ran "
             "every rank in turn on one device, transfers as device copies: they are not multi-GPU results.", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"
