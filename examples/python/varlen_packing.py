"""Sequences of different lengths packed into one tensor (no padding) and attended with
flash_attn_varlen_func; the same result as running each sequence on its own.

    python examples/python/varlen_packing.py [--device cuda]
"""

import argparse

import torch
import torch.nn.functional as F

import fmha


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args(argv)
    dtype = torch.float32 if args.device == "cpu" else torch.bfloat16
    heads, kv_heads, head_dim = 8, 2, 64
    lengths = [37, 0, 128, 5]  # an empty sequence is fine
    # cu_seqlens: int32 offsets of each sequence in the packed rows, [0, 37, 37, 165, 170].
    cu_seqlens = F.pad(torch.tensor(lengths).cumsum(0), (1, 0)).to(torch.int32).to(args.device)
    total = sum(lengths)
    q = torch.randn(total, heads, head_dim, device=args.device, dtype=dtype)
    k = torch.randn(total, kv_heads, head_dim, device=args.device, dtype=dtype)
    v = torch.randn(total, kv_heads, head_dim, device=args.device, dtype=dtype)

    out = fmha.flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max(lengths), max(lengths), causal=True)

    worst = 0.0
    for i, n in enumerate(lengths):
        if n == 0:
            continue
        s, e = int(cu_seqlens[i]), int(cu_seqlens[i + 1])
        alone = fmha.flash_attn_func(q[None, s:e], k[None, s:e], v[None, s:e], causal=True)[0]
        worst = max(worst, (out[s:e] - alone).abs().max().item())
    print(f"packed {len(lengths)} sequences ({total} tokens); max difference to one-by-one: {worst:.2e}")
    return worst


if __name__ == "__main__":
    main()
