"""Chunked prefill over a paged KV cache: each sequence has `context` keys already in its
pages and a new chunk of `chunk` query rows (whose keys are the cache's last `chunk`
positions), causal bottom-right, 32 query heads over 8 KV heads, D = 128: vLLM's
flash_attn_varlen_func call (block_table, seqused_k, no cu_seqlens_k).  The same work on
contiguous varlen tensors (the keys gathered out of the pages beforehand, cu_seqlens_k) is
timed in the same run, and the figure of merit is fmha's paged time over its contiguous
time.  flash-attn 2's paged varlen call joins where it is installed (its pages must be
multiples of 256)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

import fmha

from . import timing


@dataclass(frozen=True)
class PrefillCase:
    batch: int
    context: int  # keys already cached before the chunk
    chunk: int  # new query rows per sequence
    page: int
    heads_q: int = 32
    heads_k: int = 8
    head_dim: int = 128

    def label(self) -> str:
        return f"B={self.batch} ctx={self.context} chunk={self.chunk} page={self.page}"

    def flops(self) -> float:
        """Forward FLOPs: 4 D Hq per (query, visible key), causal bottom-right."""
        pairs = self.chunk * self.context + self.chunk * (self.chunk + 1) / 2
        return 4.0 * self.head_dim * self.heads_q * self.batch * pairs


def cases(device: torch.device, quick: bool) -> list[PrefillCase]:
    if device.type != "cuda":
        return [PrefillCase(2, 48, 16, page, heads_q=4, heads_k=2, head_dim=32) for page in (16, 32)]
    shapes = [(4, 4096, 512)] if quick else [(1, 16384, 2048), (4, 4096, 512), (8, 8192, 1024), (16, 2048, 256)]
    return [PrefillCase(b, ctx, chunk, page) for b, ctx, chunk in shapes for page in (16, 256)]


@dataclass
class Inputs:
    q: torch.Tensor  # (B * chunk, Hq, D)
    k_cache: torch.Tensor  # (pages, page, Hk, D)
    v_cache: torch.Tensor
    block_table: torch.Tensor
    seqused_k: torch.Tensor
    cu_seqlens_q: torch.Tensor
    k: torch.Tensor  # (B * (context + chunk), Hk, D): the same keys, contiguous
    v: torch.Tensor
    cu_seqlens_k: torch.Tensor


def make_inputs(case: PrefillCase, device, dtype) -> Inputs:
    keys = case.context + case.chunk
    per_seq = -(-keys // case.page)
    num_pages = case.batch * per_seq
    perm = torch.randperm(num_pages, device=device).to(torch.int32)
    table = perm.reshape(case.batch, per_seq)
    k_cache = torch.randn(num_pages, case.page, case.heads_k, case.head_dim, device=device, dtype=dtype)
    v_cache = torch.randn_like(k_cache)
    # The contiguous copy: sequence b's positions in order, gathered once out of the pages.
    pos = torch.arange(keys, device=device)
    rows = table[:, pos // case.page].long() * case.page + pos % case.page  # (B, keys) flat page rows
    k = k_cache.reshape(-1, case.heads_k, case.head_dim)[rows.reshape(-1)]
    v = v_cache.reshape(-1, case.heads_k, case.head_dim)[rows.reshape(-1)]
    i32 = dict(dtype=torch.int32, device=device)
    return Inputs(
        q=torch.randn(case.batch * case.chunk, case.heads_q, case.head_dim, device=device, dtype=dtype),
        k_cache=k_cache, v_cache=v_cache, block_table=table,
        seqused_k=torch.full((case.batch,), keys, **i32),
        cu_seqlens_q=torch.arange(0, case.batch + 1, **i32) * case.chunk,
        k=k, v=v, cu_seqlens_k=torch.arange(0, case.batch + 1, **i32) * keys)


@dataclass
class PrefillPeer:
    name: str
    run: Callable[[PrefillCase, Inputs], torch.Tensor]
    unsupported: Callable[[PrefillCase], Optional[str]] = lambda case: None


def _fmha_paged(case: PrefillCase, x: Inputs) -> torch.Tensor:
    return fmha.flash_attn_varlen_func(x.q, x.k_cache, x.v_cache, cu_seqlens_q=x.cu_seqlens_q,
                                       max_seqlen_q=case.chunk, seqused_k=x.seqused_k,
                                       max_seqlen_k=case.context + case.chunk, causal=True,
                                       block_table=x.block_table)


def _fmha_contiguous(case: PrefillCase, x: Inputs) -> torch.Tensor:
    return fmha.flash_attn_varlen_func(x.q, x.k, x.v, x.cu_seqlens_q, x.cu_seqlens_k, case.chunk,
                                       case.context + case.chunk, causal=True)


def peers(device: torch.device) -> list[PrefillPeer]:
    out = [PrefillPeer("fmha-paged", _fmha_paged), PrefillPeer("fmha-contiguous", _fmha_contiguous)]
    if device.type == "cuda":
        try:
            from flash_attn import flash_attn_varlen_func as fa2
        except ImportError:
            fa2 = None
        if fa2 is not None:
            def run(case, x):
                return fa2(x.q, x.k_cache, x.v_cache, x.cu_seqlens_q, x.cu_seqlens_k, case.chunk,
                           case.context + case.chunk, causal=True, block_table=x.block_table)
            out.append(PrefillPeer("flash-attn2-paged", run,
                                   lambda case: None if case.page % 256 == 0 else "pages of a multiple of 256 only"))
    return out


def check_fmha(case: PrefillCase, device, dtype) -> float:
    """Relative difference of fmha's paged result from its contiguous varlen result on the
    same keys (each is checked against the float64 reference by the test suite)."""
    x = make_inputs(case, device, dtype)
    paged, plain = _fmha_paged(case, x).float(), _fmha_contiguous(case, x).float()
    return ((paged - plain).norm() / plain.norm()).item()


def run_case(peer: PrefillPeer, case: PrefillCase, device, dtype, budget_s: float) -> float:
    """Median ms of one call, cycling through three input sets."""
    sets = [make_inputs(case, device, dtype) for _ in range(3)]
    return timing.median_ms([lambda s=s: peer.run(case, s) for s in sets], device, budget_s=budget_s)
