import cProfile, pstats, time, torch, fmha, io
from fmha import _C, ops
dev = "cuda"
def mk(B, S, H, D, grad):
    return [torch.randn(B, S, H, D, device=dev, dtype=torch.bfloat16, requires_grad=grad) for _ in range(4)]
# time spent inside _C.fwd / _C.bwd
acc = {"fwd": 0.0, "bwd": 0.0, "n": 0}
orig_fwd, orig_bwd = _C.fwd, _C.bwd
def tf(*a):
    t = time.perf_counter(); r = orig_fwd(*a); acc["fwd"] += time.perf_counter() - t; return r
def tb(*a):
    t = time.perf_counter(); r = orig_bwd(*a); acc["bwd"] += time.perf_counter() - t; return r
for (B, S, H, D) in ((32, 512, 16, 128), (32, 512, 8, 256)):
    for grad in (False, True):
        q, k, v, do = mk(B, S, H, D, grad)
        def f():
            o = fmha.flash_attn_func(q, k, v, causal=True)
            if grad: torch.autograd.grad(o, (q, k, v), do)
        for _ in range(20): f()
        torch.cuda.synchronize()
        N = 50
        t = time.perf_counter()
        for _ in range(N): f()
        host = (time.perf_counter() - t) / N * 1e6
        torch.cuda.synchronize()
        _C.fwd, _C.bwd = tf, tb
        acc.update(fwd=0.0, bwd=0.0)
        t = time.perf_counter()
        for _ in range(N): f()
        host2 = (time.perf_counter() - t) / N * 1e6
        torch.cuda.synchronize()
        _C.fwd, _C.bwd = orig_fwd, orig_bwd
        print(f"B={B} S={S} D={D} grad={grad}: host/call {host:.1f} us (wrapped {host2:.1f}); in _C.fwd {acc['fwd']/N*1e6:.1f} us, _C.bwd {acc['bwd']/N*1e6:.1f} us")
        # torch only reference: empty allocations
        pr = cProfile.Profile(); pr.enable()
        for _ in range(N): f()
        pr.disable(); torch.cuda.synchronize()
        s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(22); print(s.getvalue())
# bare costs
x = torch.empty(1, device=dev)
for name, fn in [("torch.empty cuda", lambda: torch.empty((32, 512, 16, 128), dtype=torch.bfloat16, device=dev)),
                 ("current_device", torch.cuda.current_device),
                 ("is_capturing", torch.cuda.is_current_stream_capturing),
                 ("raw stream", lambda: torch._C._cuda_getCurrentRawStream(0)),
                 ("zeros cpu 2", lambda: torch.zeros(2, dtype=torch.int64))]:
    t = time.perf_counter()
    for _ in range(1000): fn()
    print(f"{name}: {(time.perf_counter()-t)/1000*1e6:.2f} us")
