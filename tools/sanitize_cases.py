#!/usr/bin/env python3
"""A representative set of fmha GPU calls for compute-sanitizer (memcheck, racecheck):
tile-unaligned lengths, causal/window/softcap/ALiBi/dropout, GQA, varlen with an empty
sequence, deterministic and atomic backward, each head-dim class once.

    compute-sanitizer --tool memcheck --kernel-regex kns=fmha python tools/sanitize_cases.py
"""

import torch

import fmha


def run(b, sq, sk, hq, hk, d, dtype=torch.bfloat16, **kw):
    q = torch.randn(b, sq, hq, d, device="cuda", dtype=dtype, requires_grad=True)
    k = torch.randn(b, sk, hk, d, device="cuda", dtype=dtype, requires_grad=True)
    v = torch.randn(b, sk, hk, d, device="cuda", dtype=dtype, requires_grad=True)
    out = fmha.flash_attn_func(q, k, v, **kw)
    out.backward(torch.randn_like(out))


def run_varlen(d, dtype=torch.float16, **kw):
    lens = [5, 0, 77, 130]
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device="cuda")
    total = int(cu[-1])
    q, k, v = (torch.randn(total, 4, d, device="cuda", dtype=dtype, requires_grad=True) for _ in range(3))
    out = fmha.flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), **kw)
    if isinstance(out, tuple):  # return_attn_probs
        out = out[0]
    out.backward(torch.randn_like(out))


def main():
    slopes = torch.rand(4, device="cuda")
    run(2, 200, 200, 4, 2, 128, causal=True)
    run(1, 77, 150, 4, 4, 64, window_size=(20, 5), softcap=10.0, dropout_p=0.1, deterministic=True)
    run(1, 130, 61, 4, 1, 256, alibi_slopes=slopes)
    run(1, 65, 65, 2, 2, 96, dtype=torch.float16, causal=True, deterministic=True)
    run(1, 33, 40, 2, 2, 192, dropout_p=0.2)
    run(1, 17, 17, 2, 2, 32, causal=True)
    run(1, 40, 50, 2, 1, 40, dtype=torch.float32, causal=True)  # fp32 path, padded head dim
    run_varlen(64, causal=True)
    run_varlen(128, deterministic=True, return_attn_probs=True, dropout_p=0.1)
    torch.cuda.synchronize()
    print("sanitize cases done")


if __name__ == "__main__":
    main()
