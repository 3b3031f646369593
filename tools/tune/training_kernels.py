"""The training table's calls taken apart by kernel: fmha's or FlashAttention-4's forward and
forward + backward at bf16, 16,384 tokens of width 2048 (D = 128 and 64, S = 4k, 8k, 16k,
causal and not), each timed as 20 calls back to back, then one forward + backward under
torch.profiler with every kernel's device time.  The backward alone is the difference of the
two timed modes (as the benchmark's figures imply it); the profiled kernels show where it goes.

    python tools/tune/training_kernels.py fmha|fa4     (fa4: tools/fa4_carry.sh brings it)
"""

import sys

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


def main() -> None:
    which = sys.argv[1] if len(sys.argv) > 1 else "fmha"
    f = attention(which)
    for d in (128, 64):
        for causal in (False, True):
            for s in (4096, 8192, 16384):
                b, h = 16384 // s, 2048 // d
                q, k, v, do = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                               for _ in range(4))
                fwd = lambda: f(q, k, v, causal)
                fwd_bwd = lambda: torch.autograd.grad(f(q, k, v, causal), (q, k, v), do)
                flops = 4 * b * h * s * s * d / (2 if causal else 1)
                t_fwd, t_fb = per_call_ms(fwd, 20), per_call_ms(fwd_bwd, 20)
                t_bwd = t_fb - t_fwd
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    fwd_bwd()
                    torch.cuda.synchronize()
                kernels = [(e.name, e.device_time) for e in prof.events() if e.device_time > 0]
                print(f"{which} D={d} S={s} causal={causal}: fwd {t_fwd * 1e3:.0f} us ({flops / t_fwd / 1e9:.0f}), "
                      f"fwd+bwd {t_fb * 1e3:.0f} us ({3.5 * flops / t_fb / 1e9:.0f}), bwd {t_bwd * 1e3:.0f} us "
                      f"({2.5 * flops / t_bwd / 1e9:.0f} TFLOP/s); profiled kernels sum "
                      f"{sum(t for _, t in kernels):.0f} us")
                for name, t in kernels:
                    print(f"     {t:9.1f} us  {name[:110]}")


if __name__ == "__main__":
    main()
