"""Decode by kernel time for A/B runs of two wheels installed side by side: the decode suite's
shapes (contiguous and paged-16 bf16 caches, contiguous fp8 caches) timed as the benchmark
times them (timing.median_ms_graph, sixteen calls a replay, input sets rotated past the L2),
with cuDNN's contiguous bf16 call beside them as a control for the GPU's drift between
processes.  One process per wheel and round, alternating (A B B A):

    PYTHONPATH=/tmp/wA python3 tools/tune/decode_graph_ab.py A
"""
import sys

import torch

from fmha.bench import decode

dev = torch.device("cuda")
tag = sys.argv[1] if len(sys.argv) > 1 else "-"
budget = 0.15
peers = {p.name: p for p in decode.peers(dev)}
for case in decode.cases(dev, quick=False):
    if case.page not in (None, 16):
        continue
    row = [f"{tag} | {case.label():<22}"]
    names = ["fmha"] + (["fmha-fp8", "torch-cudnn"] if case.page is None else [])
    for name in names:
        if name in peers:
            ms, _ = decode.run_case(peers[name], case, dev, torch.bfloat16, budget)
            row.append(f"{name} {ms * 1e3:7.1f} us")
    print(" | ".join(row), flush=True)
