"""Paged prefill by kernel time: each paged_prefill shape's paged and contiguous calls timed in
CUDA graphs (timing.median_ms_graph, sixteen calls a replay), so that the contiguous call's
host check of cu_seqlens (skipped under capture) stays out of the ratio.  For A/B runs of two
wheels installed side by side, one process per wheel and round:

    PYTHONPATH=/tmp/wA python3 tools/tune/paged_graph_ab.py A
"""
import sys

import torch

from fmha.bench import paged_prefill as pp, timing

dev = torch.device("cuda")
tag = sys.argv[1] if len(sys.argv) > 1 else "-"
for case in pp.cases(dev, quick=False):
    sets = [pp.make_inputs(case, dev, torch.bfloat16) for _ in range(3)]
    paged = timing.median_ms_graph([lambda s=s: pp._fmha_paged(case, s) for s in sets], dev, budget_s=0.25)
    contig = timing.median_ms_graph([lambda s=s: pp._fmha_contiguous(case, s) for s in sets], dev, budget_s=0.25)
    print(f"{tag} | {case.label()} | paged {paged:.4f} | contiguous {contig:.4f} | {paged / contig:.3f}", flush=True)
