"""The training table's calls taken apart by kernel: fmha's or FlashAttention-4's forward and
forward + backward at bf16, 16,384 tokens of width 2048 (D = 128 and 64, S = 4k, 8k, 16k
by default, causal and not).  Each mode is timed as `calls` calls back to back (device
events around the run, as the benchmark's figures imply it; the backward alone is the
difference of the two modes), then the same back-to-back forward + backward calls run again
under torch.profiler: each kernel's mean device time per call, their sum ("busy") and the
span from the first kernel's start to the last one's end per call.  Span minus busy is the
device's idle time between kernels (launch gaps, host stalls); with the timed figure it tells
the kernels' own cost from what lies around them.  (The profile covers calls like the timed
ones, back to back, rather than one call alone.)

    python tools/tune/training_kernels.py fmha|fa4 [--dims 128,64] [--seqlens 4096,8192,16384]
                                                   [--calls 20]
    (fa4: tools/fa4_carry.sh brings it)
"""

import argparse
import collections
import json
import os
import tempfile
import time

import torch
from torch.profiler import ProfilerActivity, profile


def attention(which: str):
    if which == "fa4":
        from flash_attn.cute import flash_attn_func as fa4
        return lambda q, k, v, causal: fa4(q, k, v, causal=causal)[0]
    from fmha import flash_attn_func
    return lambda q, k, v, causal: flash_attn_func(q, k, v, causal=causal)


def per_call_ms(fn, calls: int) -> float:
    fn()
    torch.cuda.synchronize()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(calls):
        fn()
    end.record()
    torch.cuda.synchronize()
    return begin.elapsed_time(end) / calls


def profiled(fn, calls: int):
    """({kernel name: mean us per call}, busy us per call, span us per call) of `calls` calls
    back to back, from the profiler's trace (kernels and memsets on the device)."""
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = [e for e in json.load(f)["traceEvents"]
                      if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy")]
    finally:
        os.remove(path)
    by_name = collections.defaultdict(float)
    for e in events:
        by_name[e["name"]] += e["dur"] / calls
    start = min(e["ts"] for e in events)
    end = max(e["ts"] + e["dur"] for e in events)
    return by_name, sum(by_name.values()), (end - start) / calls


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("which", nargs="?", default="fmha", choices=("fmha", "fa4"))
    ap.add_argument("--dims", default="128,64")
    ap.add_argument("--seqlens", default="4096,8192,16384")
    ap.add_argument("--calls", type=int, default=20)
    a = ap.parse_args()
    f = attention(a.which)
    for d in map(int, a.dims.split(",")):
        for causal in (False, True):
            for s in map(int, a.seqlens.split(",")):
                b, h = 16384 // s, 2048 // d
                q, k, v, do = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                               for _ in range(4))
                fwd = lambda: f(q, k, v, causal)
                fwd_bwd = lambda: torch.autograd.grad(f(q, k, v, causal), (q, k, v), do)
                flops = 4 * b * h * s * s * d / (2 if causal else 1)
                t_fwd, t_fb = per_call_ms(fwd, a.calls), per_call_ms(fwd_bwd, a.calls)
                t_bwd = t_fb - t_fwd
                kernels, busy, span = profiled(fwd_bwd, a.calls)
                print(f"{time.strftime('%H:%M:%S')} {a.which} D={d} S={s} causal={causal}: fwd {t_fwd * 1e3:.0f} us ({flops / t_fwd / 1e9:.0f}), "
                      f"fwd+bwd {t_fb * 1e3:.0f} us ({3.5 * flops / t_fb / 1e9:.0f}), bwd {t_bwd * 1e3:.0f} us "
                      f"({2.5 * flops / t_bwd / 1e9:.0f} TFLOP/s); profiled, per call of {a.calls} back to back: "
                      f"kernels {busy:.0f} us, span {span:.0f} us, idle {span - busy:.0f} us")
                for name, t in kernels.items():
                    print(f"     {t:9.1f} us  {name[:110]}")


if __name__ == "__main__":
    main()
