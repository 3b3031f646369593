"""Backward device time at head dims 65-96 (and 128 for scale): the sm_90a kernel (96 padded
to 128) against the mma.sync one (FMHA_FORCE_MMA_SYNC=1, the path these head dims took
before), 16k tokens, about 2048 wide, bf16.  The backward of one forward, timed with events
around torch.autograd.grad (retain_graph), median of 20 after warm-up."""

import os
import statistics

import torch

import fmha

dev = "cuda"
print(f"# {torch.cuda.get_device_name(0)}, torch {torch.__version__}")


def bwd_ms(d, s, causal):
    b, h = 16384 // s, max(1, 2048 // d)
    q, k, v, do = (torch.randn(b, s, h, d, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(4))
    o = fmha.flash_attn_func(q, k, v, causal=causal)
    for _ in range(3):
        torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(20)]
    for a, z in ev:
        a.record()
        torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
        z.record()
    torch.cuda.synchronize()
    t = statistics.median(a.elapsed_time(z) for a, z in ev)
    return t, 4 * b * h * s * s * d * 2.5 / (2 if causal else 1) / t / 1e9


for d in (72, 80, 96, 128):
    for s in (1024, 4096, 16384):
        for causal in (False, True):
            res = {}
            for path in ("sm90a", "mma.sync"):
                os.environ["FMHA_FORCE_MMA_SYNC"] = "1" if path == "mma.sync" else "0"
                res[path] = bwd_ms(d, s, causal)
            (a, fa), (m, fm) = res["sm90a"], res["mma.sync"]
            print(f"D={d:3d} S={s:5d} causal={causal!s:5}: sm90a {a:.3f} ms ({fa:.0f} TFLOP/s), "
                  f"mma.sync {m:.3f} ms ({fm:.0f}), speedup {m / a:.2f}x", flush=True)
