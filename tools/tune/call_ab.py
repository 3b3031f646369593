"""Whole calls of the installed fmha timed as the benchmark's training and fp8 suites make
them, for A/B runs of two builds: one process per build and round, the builds alternating
(`PYTHONPATH=<target of one wheel>`), each case the median of `--rounds` runs of `--calls`
calls back to back between two device events (so the host's work overlaps the device's, and
the gaps between a call's kernels count).  Cases: bf16 forward + backward (16,384 tokens of
width 2048) and the fp8 forward, at the head dims and lengths given (an empty list skips one).

    PYTHONPATH=/tmp/A python tools/tune/call_ab.py --tag A1 [--dims 64,128] [--seqlens 1024,4096]
    PYTHONPATH=/tmp/B python tools/tune/call_ab.py --tag B1 ...   (then A2, B2, ...; one file)
    python tools/tune/call_ab.py --summary FILE   (per case: each build's best round, A / B,
                                                   and A / B round by round; above 1: B faster)
"""

import argparse
import collections
import os
import re
import statistics
import sys


def summary(path: str) -> None:
    rows = collections.defaultdict(dict)
    with open(path) as f:
        for line in f:
            m = re.match(r"([AB])(\d+) (\S+ D=\d+ S=\d+ causal=\d) ([\d.]+) us", line)
            if m:
                rows[m.group(3)][(m.group(1), int(m.group(2)))] = float(m.group(4))
    for case, t in rows.items():
        a = min(v for (w, _), v in t.items() if w == "A")
        b = min(v for (w, _), v in t.items() if w == "B")
        rounds = sorted({r for _, r in t})
        per = " ".join(f"{t[('A', r)] / t[('B', r)]:.3f}" for r in rounds if ("A", r) in t and ("B", r) in t)
        print(f"{case:34s} A {a:9.1f} us  B {b:9.1f} us  A/B {a / b:.3f}  by round {per}")


def per_call_us(fn, calls: int, rounds: int) -> float:
    return statistics.median(per_call_ms(fn, calls) * 1e3 for _ in range(rounds))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--summary", metavar="FILE")
    ap.add_argument("--tag", default="")
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--fp8-dims", default="128,256")
    ap.add_argument("--seqlens", default="1024,4096")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    if a.summary:
        return summary(a.summary)
    global torch, fmha, per_call_ms
    import torch  # the summary needs none of these
    import fmha
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from training_kernels import per_call_ms
    seqlens = [int(s) for s in a.seqlens.split(",") if s]
    for mode, dims in (("fwd_bwd", a.dims), ("fp8_fwd", a.fp8_dims)):
        for d in (int(x) for x in dims.split(",") if x):
            for causal in (False, True):
                for s in seqlens:
                    b, h = 16384 // s, 2048 // d
                    if mode == "fwd_bwd":
                        q, k, v, do = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16,
                                                   requires_grad=True) for _ in range(4))
                        fn = lambda: torch.autograd.grad(fmha.flash_attn_func(q, k, v, causal=causal), (q, k, v), do)
                    else:
                        q, k, v = (torch.randn(b, s, h, d, device="cuda").to(torch.float8_e4m3fn) for _ in range(3))
                        one = torch.ones((), device="cuda")
                        fn = lambda: fmha.flash_attn_func(q, k, v, causal=causal, q_descale=one, k_descale=one,
                                                          v_descale=one)
                    us = per_call_us(fn, a.calls, a.rounds)
                    print(f"{a.tag} {mode} D={d} S={s} causal={int(causal)} {us:.1f} us", flush=True)
                    del q, k, v, fn


if __name__ == "__main__":
    main()
