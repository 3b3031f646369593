# racecheck on the D = 64 192-row tiles alone (the full case list takes minutes under racecheck); run
# from the repository root.
import sys, time, torch
sys.path.insert(0, "tools")
from sanitize_cases import run
t0 = time.time()
for args, kw in [((1, 250, 8300, 4, 2, 64), dict(softcap=10.0)), ((1, 300, 8300, 2, 2, 64), {}),
                 ((1, 100, 16600, 2, 2, 48), dict(causal=True))]:
    run(*args, **kw)
    torch.cuda.synchronize()
    print("case", args, kw, f"done at {time.time() - t0:.0f} s", flush=True)
print("race64 done")
