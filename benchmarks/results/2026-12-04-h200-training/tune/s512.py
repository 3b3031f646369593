"""Eager (bench) vs graph (device only) vs host time per call, fmha and cuDNN."""
import time, sys, torch
from fmha.bench import peers as P, timing
from fmha.bench.__main__ import _inputs
dev = torch.device("cuda")
ps = {p.name: p for p in P.peers(dev) if p.name in ("fmha", "torch-cudnn")}
cases = []
for d in (64, 128, 256):
    for causal in (False, True):
        for s in (512, 1024):
            cases.append(P.Case(16384 // s, s, 2048 // d, d, causal, torch.bfloat16))
def host_ms(fns, n=60):
    torch.cuda.synchronize(); t0 = time.perf_counter()
    for i in range(n): fns[i % len(fns)]()
    t1 = time.perf_counter(); torch.cuda.synchronize()
    return (t1 - t0) / n * 1e3
print(f"{'case':36s} {'mode':8s} {'peer':12s} {'eager':>8s} {'graph':>8s} {'host':>8s}")
for c in cases:
    for mode in ("fwd", "fwd_bwd"):
        for name, peer in ps.items():
            sets = _inputs(c, peer.layout, dev, 3, mode == "fwd_bwd")
            def call(q, k, v, do):
                out = peer.forward(q, k, v, c.causal)
                if mode == "fwd_bwd":
                    torch.autograd.grad(out, (q, k, v), do)
            with peer.context():
                fns = [lambda s=s: call(*s) for s in sets]
                e = timing.median_ms(fns, dev, budget_s=0.1)
                g = timing.median_ms_graph(fns, dev, budget_s=0.1)
                h = host_ms(fns)
            print(f"{c.label():36s} {mode:8s} {name:12s} {e:8.4f} {g:8.4f} {h:8.4f}", flush=True)
