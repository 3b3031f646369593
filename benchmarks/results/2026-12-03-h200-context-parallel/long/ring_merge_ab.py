# A/B of fmha.distributed._ring: an older _ring.py (_ring_old.py beside this file: for the six-kernel merge,
# `git show 30617a9:python/fmha/distributed/_ring.py > _ring_old.py`) against the installed one, one simulated
# zigzag rank with no transfers (the context-parallel suite's compute-only call), W = 8, D = 128, H = 8,
# causal bf16: host issue time and device time per rank call, three alternating rounds; outputs compared.
import importlib.util
import os
import sys
import time

import torch

from fmha.bench.context_parallel import _SimComm
from fmha.distributed import _ring as new
from fmha.distributed.sharding import shard

here = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("fmha.distributed._ring_old", os.path.join(here, "_ring_old.py"))
old = importlib.util.module_from_spec(spec)
spec.loader.exec_module(old)
dev = torch.device("cuda")
W, H, D = 8, 8, 128
for S in (32768, 131072):
    torch.manual_seed(0)
    q, k, v, do = (torch.randn(1, S, H, D, device=dev, dtype=torch.bfloat16) for _ in range(4))
    for r in (0, 3):
        lq, lk, lv, ldo = (shard(x, r, W, "zigzag") for x in (q, k, v, do))
        for bwd in (False, True):
            def call(m):
                geom = m.FixedGeom("zigzag", S // W, W, -1, 0)
                out, lse = m.ring_forward(lq, lk, lv, geom, D ** -0.5, 0.0, None, comm=_SimComm(r, W, dev, null=True))
                res = (out, lse)
                if bwd:
                    res += m.ring_backward(ldo, None, lq, lk, lv, out, lse, geom, D ** -0.5, 0.0, False, None,
                                           comm=_SimComm(r, W, dev, null=True))
                return res
            a, b = call(old), call(new)
            diff = max((x.float() - y.float()).abs().max().item() for x, y in zip(a, b))
            res = {"old": [], "new": []}
            for rnd in range(3):
                for name, m in (("old", old), ("new", new)):
                    for _ in range(2):
                        call(m)
                    torch.cuda.synchronize()
                    n = 10
                    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    t0 = time.perf_counter()
                    e0.record()
                    for _ in range(n):
                        call(m)
                    issue = (time.perf_counter() - t0) / n * 1e3
                    e1.record()
                    torch.cuda.synchronize()
                    res[name].append((issue, e0.elapsed_time(e1) / n))
            fmt = lambda xs: " ".join(f"{i:.2f}/{d:.2f}" for i, d in xs)  # noqa: E731
            print(f"S={S} rank={r} {'fwd_bwd' if bwd else 'fwd'}: issue/device ms  old {fmt(res['old'])}  "
                  f"new {fmt(res['new'])}  max |old - new| {diff:.3g}", flush=True)
    del q, k, v, do
