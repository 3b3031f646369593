"""The paged-prefill calls of tools/sanitize_cases.py alone (the sm_90a forward reading pages of
16, 32, 48 and 256 at every head-dim class, block-table entries and lengths past the cache),
for compute-sanitizer on that kernel:

    compute-sanitizer --tool racecheck --kernel-regex kns=fwd_sm90 python3 tools/tune/paged_sanitize.py tools
"""
import sys

import torch

sys.path.insert(0, sys.argv[1])
import sanitize_cases as sc  # noqa: E402

sc.run_paged_prefill(128, 16, causal=True)
sc.run_paged_prefill(128, 256, dtype=torch.float16, lens_k=(1100, 600, 16, 333))  # D = 128's 3-stage ring
sc.run_paged_prefill(64, 256)
sc.run_paged_prefill(96, 48, bad=True, causal=True)
sc.run_paged_prefill(256, 16, window_size=(100, 0))
sc.run_paged_prefill(192, 32, bad=True, causal=True, softcap=20.0)
torch.cuda.synchronize()
print("paged sanitize cases done")
