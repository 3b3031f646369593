#!/usr/bin/env python3
"""Decode split-KV sweep on a GPU: K/V read bandwidth of fmha.flash_attn_with_kvcache for
each num_splits (0 = the heuristic) at the benchmark's shapes, bf16 and fp8 caches, next to
the device copy rate.  Used to set csrc/cuda_fmha/decode.cu's heuristic (docs/tuning.md).

    python tools/tune/decode_splits.py [--splits 0,1,2,4,8,16,32,64]
"""

import argparse

import torch

import fmha
from fmha.bench import timing

SHAPES = [(1, 8192), (1, 32768), (1, 131072), (16, 4096), (64, 4096), (8, 32768)]


def copy_gbps(device):
    x = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    ms = timing.median_ms([lambda: y.copy_(x)], device, budget_s=1.0)
    return 2 * x.numel() / (ms * 1e-3) / 1e9


def make(b, n, quant, page, dev):
    q = torch.randn(b, 1, 32, 128, device=dev, dtype=torch.bfloat16)
    k = torch.randn(b, n, 8, 128, device=dev, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    extra = {}
    if quant:
        k, ks = fmha.quantize_kv_cache(k)
        v, vs = fmha.quantize_kv_cache(v)
        extra = dict(k_scale=ks, v_scale=vs)
    if page:
        pages = n // page
        perm = torch.randperm(b * pages, device=dev).to(torch.int32)
        extra["block_table"] = perm.reshape(b, pages)
        k = k.reshape(b * pages, page, 8, 128)[perm.argsort()]
        v = v.reshape(b * pages, page, 8, 128)[perm.argsort()]
    return q, k, v, torch.full((b,), n, dtype=torch.int32, device=dev), extra


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--splits", default="0,1,2,4,8,16,32,64")
    ap.add_argument("--page", type=int, default=0)
    args = ap.parse_args()
    dev = torch.device("cuda")
    print(f"copy: {copy_gbps(dev):.0f} GB/s")
    splits = [int(s) for s in args.splits.split(",")]
    print("shape".ljust(16) + "".join(f"{'auto' if s == 0 else s:>8}" for s in splits) + "   (GB/s, bf16 | fp8)")
    for b, n in SHAPES:
        for quant in (False, True):
            nbytes = 2 * b * n * 8 * 128 * (1 if quant else 2)
            sets = [make(b, n, quant, args.page, dev) for _ in range(max(2, min(16, -(-192 * 2**20 // nbytes))))]
            row = f"B={b} L={n}".ljust(12) + (" fp8" if quant else "bf16")
            for s in splits:
                ms = timing.median_ms_graph([lambda a=a: fmha.flash_attn_with_kvcache(*a[:3], cache_seqlens=a[3],
                                                                                 num_splits=s, **a[4])
                                       for a in sets], dev, budget_s=0.3)
                row += f"{nbytes / (ms * 1e-3) / 1e9:8.0f}"
            print(row, flush=True)


if __name__ == "__main__":
    main()
