"""Chunked prefill over a paged cache at pages of 16-256 beside the contiguous call (ms), bf16,
Hq = 32, Hk = 8, D = 128, causal, at B = 8 / 8k keys of context / chunks of 1024 and B = 4 / 4k /
512, and each page size's relative difference from the contiguous result; the label (first
argument) names the build or setting.  On the GPU machine:  python3 tools/tune/paged_pages.py A
"""
import sys

import torch

from fmha.bench import paged_prefill as pp

dev = torch.device("cuda")
paged, contig = pp.peers(dev)[:2]
for b, ctx, ch in [(8, 8192, 1024), (4, 4096, 512)]:
    row = [f"contig={pp.run_case(contig, pp.PrefillCase(b, ctx, ch, 256), dev, torch.bfloat16, 0.2):.3f}"]
    err = []
    for page in (16, 32, 48, 64, 256):
        c = pp.PrefillCase(b, ctx, ch, page)
        row.append(f"p{page}={pp.run_case(paged, c, dev, torch.bfloat16, 0.2):.3f}")
        err.append(f"{pp.check_fmha(c, dev, torch.bfloat16):.1e}")
    print(sys.argv[1], f"B={b} ctx={ctx}", " ".join(row), "err", " ".join(err), flush=True)
