"""Decode: one new token per sequence against a KV cache (32 query heads over 8 KV heads,
D = 128), contiguous or paged, bf16 or fp8 caches.  The figure of merit is the K/V read
bandwidth (cache bytes read once / time), to be set against the device copy rate.  Every
peer is timed by CUDA-graph replay, sixteen calls to a graph (timing.median_ms_graph), as
serving engines run decode steps: a step is microseconds of GPU work, less than the host's
per-call cost in eager mode or a graph launch's, which would be timed instead of the kernels."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F

import fmha

from . import timing


@dataclass(frozen=True)
class DecodeCase:
    batch: int
    cache_len: int
    page: Optional[int]  # None: contiguous cache
    heads_q: int = 32
    heads_k: int = 8
    head_dim: int = 128

    def label(self) -> str:
        return f"B={self.batch} L={self.cache_len} {'paged ' + str(self.page) if self.page else 'contiguous'}"

    def kv_bytes(self, elem_bytes: int) -> int:
        return 2 * self.batch * self.cache_len * self.heads_k * self.head_dim * elem_bytes


def cases(device: torch.device, quick: bool) -> list[DecodeCase]:
    if device.type != "cuda":
        shapes = [(1, 1024), (4, 512)]
        return [DecodeCase(b, n, page, heads_q=8, heads_k=2, head_dim=64) for b, n in shapes for page in (None, 16)]
    shapes = [(1, 8192), (16, 4096)] if quick else [(1, 8192), (1, 32768), (1, 131072), (16, 4096), (64, 4096),
                                                   (8, 32768)]
    pages = (None, 256) if quick else (None, 16, 256)
    return [DecodeCase(b, n, page) for b, n in shapes for page in pages]


@dataclass
class DecodePeer:
    name: str
    run: Callable  # (inputs) -> out (B, 1, Hq, D)
    make: Callable  # (case, device, dtype) -> inputs
    elem_bytes: Callable[[torch.dtype], int] = lambda dtype: torch.finfo(dtype).bits // 8
    contiguous_only: bool = False


def _fmha_inputs(case: DecodeCase, device, dtype, quantize: bool = False):
    q = torch.randn(case.batch, 1, case.heads_q, case.head_dim, device=device, dtype=dtype)
    shape = (case.batch, case.cache_len, case.heads_k, case.head_dim)
    k, v = torch.randn(shape, device=device, dtype=dtype), torch.randn(shape, device=device, dtype=dtype)
    extra = {}
    if quantize:
        k, ks = fmha.quantize_kv_cache(k, torch.float8_e4m3fn)
        v, vs = fmha.quantize_kv_cache(v, torch.float8_e4m3fn)
        extra = dict(k_scale=ks, v_scale=vs)
    seqlens = torch.full((case.batch,), case.cache_len, dtype=torch.int32, device=device)
    if case.page:
        pages = case.cache_len // case.page
        perm = torch.randperm(case.batch * pages, device=device).to(torch.int32)
        table = perm.reshape(case.batch, pages)
        k = k.reshape(case.batch * pages, case.page, case.heads_k, case.head_dim)[perm.argsort()]
        v = v.reshape(case.batch * pages, case.page, case.heads_k, case.head_dim)[perm.argsort()]
        extra["block_table"] = table
    return q, k, v, seqlens, extra


def _fmha_run(inputs):
    q, k, v, seqlens, extra = inputs
    return fmha.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, **extra)


def _sdpa_inputs(case: DecodeCase, device, dtype):
    q = torch.randn(case.batch, case.heads_q, 1, case.head_dim, device=device, dtype=dtype)
    shape = (case.batch, case.heads_k, case.cache_len, case.head_dim)
    return q, torch.randn(shape, device=device, dtype=dtype), torch.randn(shape, device=device, dtype=dtype)


def _sdpa_peer(name: str, backend: str) -> DecodePeer:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def run(inputs):
        with sdpa_kernel(getattr(SDPBackend, backend)):
            return F.scaled_dot_product_attention(*inputs, enable_gqa=True)

    return DecodePeer(name, run, _sdpa_inputs, contiguous_only=True)


# torch's SDPA reads grouped K/V heads in place from torch 2.5 (enable_gqa); before, its peers
# would have to read K and V repeated per query head, a different workload, so they sit out.
_SDPA_GQA = torch.torch_version.TorchVersion(torch.__version__) >= (2, 5)


def peers(device: torch.device) -> list[DecodePeer]:
    out = [DecodePeer("fmha", _fmha_run, _fmha_inputs)]
    if device.type == "cuda":
        out.append(DecodePeer("fmha-fp8", _fmha_run, lambda c, d, t: _fmha_inputs(c, d, t, quantize=True),
                              elem_bytes=lambda dtype: 1))
    if not _SDPA_GQA:
        return out
    if device.type == "cuda":
        out.append(_sdpa_peer("torch-flash", "FLASH_ATTENTION"))
        if hasattr(torch.nn.attention.SDPBackend, "CUDNN_ATTENTION"):
            out.append(_sdpa_peer("torch-cudnn", "CUDNN_ATTENTION"))
    out.append(_sdpa_peer("torch-math", "MATH"))
    return out


def check_fmha(case: DecodeCase, device, dtype) -> float:
    """fmha's decode against torch's math SDPA in fp32 on the first sequence."""
    small = DecodeCase(1, min(case.cache_len, 4096), None, case.heads_q, case.heads_k, case.head_dim)
    q, k, v, seqlens, _ = _fmha_inputs(small, device, dtype)
    out = fmha.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens)
    group = case.heads_q // case.heads_k  # K/V heads repeated: enable_gqa needs torch 2.5
    ref = F.scaled_dot_product_attention(q.float().transpose(1, 2),
                                         k.float().repeat_interleave(group, dim=2).transpose(1, 2),
                                         v.float().repeat_interleave(group, dim=2).transpose(1, 2)).transpose(1, 2)
    return ((out.float() - ref).norm() / ref.norm()).item()


def run_case(peer: DecodePeer, case: DecodeCase, device, dtype, budget_s: float) -> tuple[float, float]:
    """(median ms, GB/s of K/V read)."""
    # Enough input sets that one cycle through them is about 3x the L2 (60 MB on an H200),
    # so no run finds its cache in L2 from the previous one.
    nbytes = case.kv_bytes(peer.elem_bytes(dtype))
    sets = [peer.make(case, device, dtype) for _ in range(max(2, min(16, -(-192 * 2**20 // nbytes))))]
    ms = timing.median_ms_graph([lambda s=s: peer.run(s) for s in sets], device, budget_s=budget_s)
    return ms, case.kv_bytes(peer.elem_bytes(dtype)) / (ms * 1e-3) / 1e9
