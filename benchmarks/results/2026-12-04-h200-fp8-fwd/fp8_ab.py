# fp8 forward, kernel A/B across two installs of fmha (PYTHONPATH picks one): CUDA-event
# medians of flash_attn_func on e4m3 q, k, v (per-tensor descales), 16k tokens, H x D = 2048.
import sys, statistics, torch, fmha
tag = sys.argv[1]
dev = "cuda"
torch.manual_seed(0)
for D in (64, 128, 256):
    H = 2048 // D
    for causal in (False, True):
        for S in (1024, 4096, 16384):
            B = 16384 // S
            q, k, v = (torch.randn(B, S, H, D, device=dev).to(torch.float8_e4m3fn) for _ in range(3))
            s = torch.tensor(0.5, device=dev)
            f = lambda: fmha.flash_attn_func(q, k, v, causal=causal, q_descale=s, k_descale=s, v_descale=s)
            for _ in range(3): f()
            torch.cuda.synchronize()
            ts = []
            reps = max(3, int(1e10 / (B * H * S * S * D)))
            for _ in range(5):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                for _ in range(reps): f()
                b.record(); b.synchronize()
                ts.append(a.elapsed_time(b) / reps)
            t = statistics.median(ts)
            fl = 4 * B * H * S * S * D / (2 if causal else 1)
            print(f"{tag} D={D} S={S} causal={int(causal)} {t*1e3:9.1f} us {fl / t / 1e9:7.1f} TFLOP/s", flush=True)
