"""Forward + backward with deterministic=True against the default, fmha on the GPU, at the
training table's shapes (16k tokens, width 2048, bf16): device time (median of events after
warm-up, fmha.bench.timing), and the ratio the backward issue bounds (1.15x from S = 4k).

    python deterministic.py [--seqlens 1024,4096,16384] [--dims 64,128,256]
"""

import argparse

import torch

import fmha
from fmha.bench.timing import median_ms

parser = argparse.ArgumentParser()
parser.add_argument("--seqlens", default="1024,4096,16384")
parser.add_argument("--dims", default="64,128,256")
args = parser.parse_args()
dev = torch.device("cuda")
print(f"# {torch.cuda.get_device_name(0)}, torch {torch.__version__}, fmha {fmha.__version__}")
for d in map(int, args.dims.split(",")):
    for s in map(int, args.seqlens.split(",")):
        for causal in (False, True):
            b, h = 16384 // s, 2048 // d
            sets = [[torch.randn(b, s, h, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
                     for _ in range(4)] for _ in range(2)]
            times = {}
            for det in (False, True):
                def run(q, k, v, do, det=det):
                    o = fmha.flash_attn_func(q, k, v, causal=causal, deterministic=det)
                    torch.autograd.grad(o, (q, k, v), do)
                times[det] = median_ms([lambda t=t: run(*t) for t in sets], dev, budget_s=0.5)
            print(f"D={d} S={s} causal={causal}: fwd+bwd default {times[False]:.3f} ms, "
                  f"deterministic {times[True]:.3f} ms ({times[True] / times[False]:.2f}x)", flush=True)
