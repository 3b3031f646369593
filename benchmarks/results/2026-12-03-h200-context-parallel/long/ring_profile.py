# Where a simulated ring rank's time goes (S = 32k and 128k, W = 8, D = 128, H = 8, causal zigzag).
import sys, time, torch
from torch.profiler import profile, ProfilerActivity
import fmha
from fmha.distributed import _ring
from fmha.distributed.sharding import shard
from fmha.bench.context_parallel import _SimComm

dev = torch.device("cuda")
W, H, D = 8, 8, 128
for S in [int(x) for x in sys.argv[1].split(",") if x]:
    torch.manual_seed(0)
    q, k, v, do = (torch.randn(1, S, H, D, device=dev, dtype=torch.bfloat16) for _ in range(4))
    L = S // W
    r = 0
    lq, lk, lv, ldo = (shard(x, r, W, "zigzag") for x in (q, k, v, do))
    geom = _ring.FixedGeom("zigzag", L, W, -1, 0)
    scale = D ** -0.5
    for bwd in (False, True):
        def call():
            out, lse = _ring.ring_forward(lq, lk, lv, geom, scale, 0.0, None, comm=_SimComm(r, W, dev, null=True))
            if bwd:
                _ring.ring_backward(ldo, None, lq, lk, lv, out, lse, geom, scale, 0.0, False, None,
                                    comm=_SimComm(r, W, dev, null=True))
        for _ in range(3): call()
        torch.cuda.synchronize()
        # host time of the calls (issued back to back) against device time
        n = 10
        t0 = time.perf_counter(); e0 = torch.cuda.Event(enable_timing=True); e1 = torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(n): call()
        t_issue = (time.perf_counter() - t0) / n * 1e3
        e1.record(); torch.cuda.synchronize()
        t_dev = e0.elapsed_time(e1) / n
        # the kernels alone: single-call fmha forward on this rank's share
        print(f"S={S} bwd={bwd}: issue {t_issue:.3f} ms/call, device {t_dev:.3f} ms/call", flush=True)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(3): call()
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=22, max_name_column_width=60), flush=True)
    del q, k, v, do

# A/B: the merge as it was (four passes) against the lerp, compute-only rank 0, fwd.
def old_merge_(acc_out, acc_lse, sel, out, lse, row_dim):
    a_out, a_lse = sel.take(acc_out, row_dim), sel.take(acc_lse, -1)
    new = torch.logaddexp(a_lse, lse)
    safe = torch.where(torch.isneginf(new), 0.0, new)
    w_old = torch.exp(a_lse - safe).transpose(-1, -2).unsqueeze(-1)
    w_new = torch.exp(lse - safe).transpose(-1, -2).unsqueeze(-1)
    sel.put_(acc_out, row_dim, a_out * w_old + out.float() * w_new)
    sel.put_(acc_lse, -1, new)

new_merge_ = _ring.merge_
from fmha.bench import timing
for S in [int(x) for x in sys.argv[2].split(",")]:
    torch.manual_seed(0)
    q, k, v, do = (torch.randn(1, S, H, D, device=dev, dtype=torch.bfloat16) for _ in range(4))
    L = S // W
    geom = _ring.FixedGeom("zigzag", L, W, -1, 0)
    for r in (0, W - 1):
        lq, lk, lv, ldo = (shard(x, r, W, "zigzag") for x in (q, k, v, do))
        for bwd in (False, True):
            res = {}
            for rnd in range(3):
                for name, m in (("old", old_merge_), ("new", new_merge_)):
                    _ring.merge_ = m
                    def call():
                        out, lse = _ring.ring_forward(lq, lk, lv, geom, D ** -0.5, 0.0, None, comm=_SimComm(r, W, dev, null=True))
                        if bwd:
                            _ring.ring_backward(ldo, None, lq, lk, lv, out, lse, geom, D ** -0.5, 0.0, False, None,
                                                comm=_SimComm(r, W, dev, null=True))
                    res.setdefault(name, []).append(timing.median_ms([call], dev, warmup=1, min_runs=5, budget_s=0.3))
            print(f"merge A/B S={S} rank={r} bwd={bwd}: old {min(res['old']):.3f} new {min(res['new']):.3f} ms "
                  f"(rounds old {['%.3f' % x for x in res['old']]} new {['%.3f' % x for x in res['new']]})", flush=True)
    _ring.merge_ = new_merge_
    # the single call on the whole sequence, for the share
    def single(bwd):
        qq, kk, vv = (x.detach().requires_grad_(bwd) for x in (q, k, v))
        out = fmha.flash_attn_func(qq, kk, vv, causal=True)
        if bwd:
            torch.autograd.grad(out, (qq, kk, vv), do)
    for bwd in (False, True):
        ms = timing.median_ms([lambda: single(bwd)], dev, warmup=1, min_runs=3, budget_s=0.3)
        print(f"single S={S} bwd={bwd}: {ms:.3f} ms, share per rank {ms / W:.3f}", flush=True)
    del q, k, v, do
    torch.cuda.empty_cache()
