"""Peak extra device memory of forward + backward, against sequence length: what the
tiling saves over standard attention, which materializes the S x S scores."""

from __future__ import annotations

import torch

from .peers import Case


def peak_extra_mib(peer, case: Case, device) -> float:
    """MiB allocated at peak by one forward + backward beyond the inputs and dout."""
    shape = ((case.batch, case.seqlen, case.heads, case.head_dim) if peer.layout == "bshd"
             else (case.batch, case.heads, case.seqlen, case.head_dim))
    q, k, v, do = (torch.randn(shape, device=device, dtype=case.dtype).requires_grad_(i < 3) for i in range(4))
    with peer.context():
        out = peer.forward(q, k, v, case.causal)  # warm-up (kernel caches, compilation)
        torch.autograd.grad(out, (q, k, v), do)
        del out
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        out = peer.forward(q, k, v, case.causal)
        grads = torch.autograd.grad(out, (q, k, v), do)
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) - base
    del out, grads
    return peak / 2**20


def cases(quick: bool, dtype) -> list[Case]:
    seqlens = (1024, 4096) if quick else (512, 1024, 2048, 4096, 8192, 16384)
    return [Case(16384 // s, s, 16, 128, False, dtype) for s in seqlens]
