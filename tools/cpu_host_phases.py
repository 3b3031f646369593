"""Host time around fmha's CPU kernels in a forward + backward call: the time before the
forward kernel starts, after it ends, before the backward kernel starts and after it ends
(medians over calls), measured by wrapping fmha._C's entry points.  With --floor, the same
for a minimal torch.autograd.Function around the same two _C calls (no checks, no options):
the least any Python-level path can cost.

    python tools/cpu_host_phases.py 8,128,2,128 1,1024,2,128 [--floor] [--calls 40]

Each shape is B,S,H,D (fp32, (B, S, H, D) layout).  The host time after a large kernel is
several times that of a small one (benchmarks/results/2026-12-05-cpu/host_time.txt): the
kernel's data have pushed the interpreter's out of the caches.
"""

import argparse
import functools
import statistics
import time

import torch

import fmha
import fmha.ops as ops
from fmha import _C, _checks
from fmha._backend import fmha_device, view

clock = time.perf_counter


def phases(shape, calls: int, floor: bool) -> list:
    B, S, H, D = shape
    q, k, v, do = (torch.randn(B, S, H, D, requires_grad=True) for _ in range(4))
    marks = {}

    class Timed:  # fmha._C with its fwd and bwd timed
        def __getattr__(self, name):
            return getattr(_C, name)

        def fwd(self, *args):
            marks[1] = clock()
            _C.fwd(*args)
            marks[2] = clock()

        def bwd(self, *args):
            marks[4] = clock()
            _C.bwd(*args)
            marks[5] = clock()

    timed = Timed()
    if floor:
        d = _checks.attention_inputs(q, k, v, None, None, None, S, S, D**-0.5, 0.0, -1, -1, None, 0.0)
        problem = ops._problem(d, q.dtype, None, None, None, D**-0.5, 0.0, -1, -1, False, None, 0.0, None)
        backend, alloc = fmha_device(q.device), functools.partial(torch.empty, dtype=torch.uint8)

        class Minimal(torch.autograd.Function):
            @staticmethod
            def forward(ctx, q, k, v):
                out, lse = torch.empty(q.shape, dtype=q.dtype), torch.empty((B, H, S), dtype=torch.float32)
                timed.fwd(backend, 0, problem, *(view(t, False) for t in (q, k, v, out)), lse.data_ptr(), None)
                ctx.save_for_backward(q, k, v, out, lse)
                return out

            @staticmethod
            def backward(ctx, dout):
                q, k, v, out, lse = ctx.saved_tensors
                dq, dk, dv = (torch.empty(x.shape, dtype=x.dtype) for x in (q, k, v))
                timed.bwd(backend, 0, problem, *(view(t, False) for t in (q, k, v, out, dout, dq, dk, dv)),
                          lse.data_ptr(), 0, False, alloc)
                return dq, dk, dv

        attention = Minimal.apply
    else:
        ops._C = timed
        attention = fmha.flash_attn_func
    rows = []
    try:
        for i in range(calls + 5):
            marks[0] = clock()
            out = attention(q, k, v)
            marks[3] = clock()
            torch.autograd.grad(out, (q, k, v), do)
            marks[6] = clock()
            if i >= 5:
                rows.append([marks[1] - marks[0], marks[3] - marks[2], marks[4] - marks[3], marks[6] - marks[5]])
    finally:
        ops._C = _C
    return [statistics.median(c) * 1e6 for c in zip(*rows)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("shapes", nargs="+", help="B,S,H,D")
    ap.add_argument("--floor", action="store_true", help="a minimal autograd.Function in place of fmha's API")
    ap.add_argument("--calls", type=int, default=40)
    args = ap.parse_args()
    print("shape            pre-fwd  post-fwd  pre-bwd  post-bwd  (us, medians)")
    for text in args.shapes:
        shape = tuple(int(x) for x in text.split(","))
        p = phases(shape, args.calls, args.floor)
        print(f"{text:16s} {p[0]:7.1f}  {p[1]:8.1f}  {p[2]:7.1f}  {p[3]:8.1f}")


if __name__ == "__main__":
    main()
