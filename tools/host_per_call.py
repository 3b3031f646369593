"""Host time per call: fmha against torch's SDPA backends on a problem so small (B = 1,
S = 128, one head, D = 64, causal) that its kernels take a few microseconds (on sm_90 also
fmha's fp8 forward, per-tensor descales), so that the
wall time of calls queued back to back is the host's work (Python, dispatch, autograd,
launches).  The host's speed drifts by tens of percent within a minute on shared machines,
so the cases are interleaved over several rounds and each is reported as the median of its
rounds, next to its ratio to cuDNN's time in the same round (median of the rounds).

    python tools/host_per_call.py [--rounds 7] [--seconds 0.3]
"""

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import fmha


def per_call_us(f, seconds: float) -> float:
    for _ in range(20):
        f()
    torch.cuda.synchronize()
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(50):
            f()
        n += 50
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / n * 1e6


def cases(dev: str):
    shape, dtype = (1, 128, 1, 64), torch.bfloat16
    q, k, v = (torch.randn(shape, device=dev, dtype=dtype, requires_grad=True) for _ in range(3))
    g = torch.ones_like(q)
    qt, kt, vt = (x.detach().transpose(1, 2).contiguous().requires_grad_(True) for x in (q, k, v))
    gt = g.transpose(1, 2)
    qd, kd, vd = (x.detach() for x in (q, k, v))

    def sdpa(backend, grad):
        def f():
            with sdpa_kernel(backend):
                if not grad:
                    return F.scaled_dot_product_attention(qt.detach(), kt.detach(), vt.detach(), is_causal=True)
                F.scaled_dot_product_attention(qt, kt, vt, is_causal=True).backward(gt)
        return f

    fp8 = {}
    if torch.cuda.get_device_capability(dev)[0] == 9:  # the fp8 forward: sm_90 only
        q8, k8, v8 = (x.to(torch.float8_e4m3fn) for x in (qd, kd, vd))
        one = torch.ones((), device=dev)
        fp8 = {("fwd", "fmha-fp8"): lambda: fmha.flash_attn_func(q8, k8, v8, causal=True, q_descale=one,
                                                                   k_descale=one, v_descale=one)}
    return {
        ("fwd", "fmha"): lambda: fmha.flash_attn_func(qd, kd, vd, causal=True),
        **fp8,
        ("fwd", "sdpa-cudnn"): sdpa(SDPBackend.CUDNN_ATTENTION, False),
        ("fwd", "sdpa-flash"): sdpa(SDPBackend.FLASH_ATTENTION, False),
        ("fwd+bwd", "fmha"): lambda: fmha.flash_attn_func(q, k, v, causal=True).backward(g),
        ("fwd+bwd", "sdpa-cudnn"): sdpa(SDPBackend.CUDNN_ATTENTION, True),
        ("fwd+bwd", "sdpa-flash"): sdpa(SDPBackend.FLASH_ATTENTION, True),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--seconds", type=float, default=0.3, help="timed seconds per case and round")
    args = ap.parse_args()
    fns = cases("cuda")
    times = {key: [] for key in fns}
    for _ in range(args.rounds):
        for key, f in fns.items():
            times[key].append(per_call_us(f, args.seconds))
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, fmha {fmha.__version__}; "
          f"B=1 S=128 H=1 D=64 bf16 causal; {args.rounds} interleaved rounds")
    print(f"{'mode':8s} {'call':11s} {'us/call (median)':>16s} {'min':>7s} {'max':>7s} {'/ cuDNN (median)':>17s}")
    for (mode, name), ts in times.items():
        ratio = statistics.median(t / c for t, c in zip(ts, times[(mode, "sdpa-cudnn")]))
        print(f"{mode:8s} {name:11s} {statistics.median(ts):16.1f} {min(ts):7.1f} {max(ts):7.1f} {ratio:17.2f}")


if __name__ == "__main__":
    main()
