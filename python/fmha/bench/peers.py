"""The implementations the benchmark runs side by side.  Each takes (B, S, H, D)-shaped
problems but receives inputs in its own native layout, so no peer pays for a transpose."""

from __future__ import annotations

import contextlib
import importlib.util
import os
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F

import fmha


@dataclass(frozen=True)
class Case:
    batch: int
    seqlen: int
    heads: int
    head_dim: int
    causal: bool
    dtype: torch.dtype

    def flops_fwd(self) -> float:
        f = 4.0 * self.batch * self.heads * self.seqlen**2 * self.head_dim
        return f / 2 if self.causal else f

    def label(self) -> str:
        return f"B={self.batch} S={self.seqlen} H={self.heads} D={self.head_dim}{' causal' if self.causal else ''}"


@dataclass
class Peer:
    name: str
    layout: str  # "bshd" (flash_attn) or "bhsd" (torch SDPA)
    forward: Callable  # (q, k, v, causal) -> out
    context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    unsupported: Callable[[Case], Optional[str]] = lambda case: None


def _sdpa_backend(backend_name: str):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return lambda: sdpa_kernel(getattr(SDPBackend, backend_name))


def _sdpa(q, k, v, causal):
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def _flex_peer(device: torch.device) -> Optional[Peer]:
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError:
        return None
    # One compiled graph per shape: without room for every shape of a sweep, dynamo stops
    # recompiling after its default limit of 8 and runs flex_attention eagerly (far slower).
    import torch._dynamo

    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 256)
    torch._dynamo.config.accumulated_cache_size_limit = max(torch._dynamo.config.accumulated_cache_size_limit, 4096)
    compiled = torch.compile(flex_attention, dynamic=False)
    masks = {}

    def causal_mod(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    def forward(q, k, v, causal):
        mask = None
        if causal:
            key = (q.shape[2], k.shape[2])
            if key not in masks:
                masks[key] = create_block_mask(causal_mod, None, None, key[0], key[1], device=device)
            mask = masks[key]
        return compiled(q, k, v, block_mask=mask)

    return Peer("flex", "bhsd", forward, unsupported=lambda c: "fp32" if c.dtype == torch.float32 else None)


@contextlib.contextmanager
def _env(name: str, value: str):
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            del os.environ[name]
        else:
            os.environ[name] = old


def _fa2_func():
    """flash-attn 2's flash_attn_func, or None.  flash-attn-4 alone installs flash_attn as a
    namespace package holding only flash_attn.cute, where this import fails."""
    if importlib.util.find_spec("flash_attn") is None:
        return None
    try:
        from flash_attn import flash_attn_func
    except ImportError:
        return None
    return flash_attn_func


def _fa4_peer() -> Optional[Peer]:
    """FlashAttention-4 (pip flash-attn-4, CuTe DSL) when importable."""
    try:
        from flash_attn.cute import flash_attn_func as fa4
    except Exception:  # noqa: BLE001 - absent, or present without its CUDA DSL
        return None

    def forward(q, k, v, causal):
        out = fa4(q, k, v, causal=causal)
        return out[0] if isinstance(out, tuple) else out

    return Peer("fa4", "bshd", forward, unsupported=lambda c: "fp32" if c.dtype == torch.float32 else None)


def peers(device: torch.device, include_math: bool = True) -> list[Peer]:
    """fmha first, then every peer importable on this device."""
    out = [Peer("fmha", "bshd", lambda q, k, v, causal: fmha.flash_attn_func(q, k, v, causal=causal))]
    if device.type == "cuda" and torch.cuda.get_device_capability(device) == (9, 0):
        # fmha's mma.sync kernels, which Hopper runs only when forced: the sm_90a path's gain.
        out.append(Peer("fmha-mma", "bshd", lambda q, k, v, causal: fmha.flash_attn_func(q, k, v, causal=causal),
                        lambda: _env("FMHA_FORCE_MMA_SYNC", "1"),
                        unsupported=lambda c: "fp32" if c.dtype == torch.float32 else None))
    if device.type == "cuda":
        out.append(Peer("torch-flash", "bhsd", _sdpa, _sdpa_backend("FLASH_ATTENTION"),
                        unsupported=lambda c: "fp32" if c.dtype == torch.float32 else None))
        out.append(Peer("torch-efficient", "bhsd", _sdpa, _sdpa_backend("EFFICIENT_ATTENTION")))
        if hasattr(torch.nn.attention.SDPBackend, "CUDNN_ATTENTION"):
            out.append(Peer("torch-cudnn", "bhsd", _sdpa, _sdpa_backend("CUDNN_ATTENTION"),
                            unsupported=lambda c: "fp32" if c.dtype == torch.float32 else None))
        flex = _flex_peer(device)
        if flex is not None:
            out.append(flex)
        fa2 = _fa2_func()
        if fa2 is not None:
            out.append(Peer("flash-attn", "bshd", lambda q, k, v, causal: fa2(q, k, v, causal=causal)))
        if importlib.util.find_spec("xformers") is not None:
            import xformers.ops as xops

            def xformers_forward(q, k, v, causal):
                return xops.memory_efficient_attention(q, k, v, attn_bias=xops.LowerTriangularMask() if causal else None)

            out.append(Peer("xformers", "bshd", xformers_forward))
        fa4 = _fa4_peer()
        if fa4 is not None:
            out.append(fa4)
    else:
        out.append(Peer("torch-flash", "bhsd", _sdpa, _sdpa_backend("FLASH_ATTENTION")))
    if include_math:
        # Standard attention, materializing the S x S matrix: the papers' baseline.
        out.append(Peer("torch-math", "bhsd", _sdpa, _sdpa_backend("MATH"),
                        unsupported=lambda c: "S x S scores too large" if
                        c.batch * c.heads * c.seqlen**2 * 4 > (8 << 30) else None))
    return out
