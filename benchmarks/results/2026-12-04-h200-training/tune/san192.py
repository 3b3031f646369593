# memcheck/racecheck/synccheck cases for D = 192's 112-key blocks (run from the repository root).
import sys, time, torch
sys.path.insert(0, "tools")
from sanitize_cases import run
t0 = time.time()
for args, kw in [((1, 250, 4200, 4, 2, 192), dict(softcap=10.0)), ((1, 300, 4200, 2, 2, 192), {}),
                 ((1, 100, 8500, 2, 2, 160), dict(causal=True))]:
    run(*args, **kw)
    torch.cuda.synchronize()
    print("case", args, kw, f"done at {time.time() - t0:.0f} s", flush=True)
print("san192 done")
