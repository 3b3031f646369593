#!/usr/bin/env python3
"""One attention shape, run a few times, for profilers (ncu, compute-sanitizer):

    ncu --clock-control none -k regex:fwd_kernel -c 1 python tools/profile_case.py
    python tools/profile_case.py --batch 4 --seqlen 4096 --heads 16 --head-dim 128 --causal --backward
"""

import argparse

import torch

import fmha


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seqlen", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--heads-k", type=int, default=None)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--backward", action="store_true")
    ap.add_argument("--deterministic", action="store_true")
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--iters", type=int, default=3)
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    hk = args.heads_k or args.heads
    shape_q = (args.batch, args.seqlen, args.heads, args.head_dim)
    shape_k = (args.batch, args.seqlen, hk, args.head_dim)
    q = torch.randn(shape_q, device="cuda", dtype=dtype, requires_grad=args.backward)
    k = torch.randn(shape_k, device="cuda", dtype=dtype, requires_grad=args.backward)
    v = torch.randn(shape_k, device="cuda", dtype=dtype, requires_grad=args.backward)
    for _ in range(args.iters):
        out = fmha.flash_attn_func(q, k, v, dropout_p=args.dropout, causal=args.causal,
                                   deterministic=args.deterministic)
        if args.backward:
            out.backward(torch.ones_like(out))
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
