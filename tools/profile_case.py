#!/usr/bin/env python3
"""One attention shape, run a few times, for profilers (ncu, compute-sanitizer):

    ncu --clock-control none -k regex:fwd_kernel -c 1 python tools/profile_case.py
    python tools/profile_case.py --batch 4 --seqlen 4096 --heads 16 --head-dim 128 --causal --backward
    ncu --clock-control none -k regex:decode_kernel -c 1 python tools/profile_case.py \
        --kvcache fp8 --batch 1 --seqlen 131072 --heads 32 --heads-k 8 --num-splits 32

--kvcache {bf16,fp8,int8} runs flash_attn_with_kvcache (one new query row) against a
contiguous cache of --seqlen positions, quantized for fp8/int8.
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
    ap.add_argument("--kvcache", choices=["bf16", "fp8", "int8"], default=None)
    ap.add_argument("--num-splits", type=int, default=0)
    args = ap.parse_args()
    if args.kvcache:
        return decode(args)
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


def decode(args):
    hk = args.heads_k or args.heads
    q = torch.randn(args.batch, 1, args.heads, args.head_dim, device="cuda", dtype=getattr(torch, args.dtype))
    k = torch.randn(args.batch, args.seqlen, hk, args.head_dim, device="cuda", dtype=q.dtype)
    v = torch.randn_like(k)
    extra = {}
    if args.kvcache != "bf16":
        dtype = torch.float8_e4m3fn if args.kvcache == "fp8" else torch.int8
        k, ks = fmha.quantize_kv_cache(k, dtype=dtype)
        v, vs = fmha.quantize_kv_cache(v, dtype=dtype)
        extra = dict(k_scale=ks, v_scale=vs)
    lens = torch.full((args.batch,), args.seqlen, dtype=torch.int32, device="cuda")
    for _ in range(args.iters):
        fmha.flash_attn_with_kvcache(q, k, v, cache_seqlens=lens, num_splits=args.num_splits, **extra)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
