# Per-kernel device time of one forward + backward (fmha and cuDNN) at short training shapes.
import torch, fmha, collections
from torch.profiler import profile, ProfilerActivity
from torch.nn.attention import sdpa_kernel, SDPBackend
F = torch.nn.functional
dev = "cuda"
def short(n):
    for key in ("fwd_sm90", "bwd_sm90", "bwd_delta", "dq_convert", "dkv_reduce", "Memset", "memset", "fill", "elementwise"):
        if key in n: return key
    return n[:60]
for S in (512, 1024, 4096):
    for D in (64, 128, 256):
        for causal in (False, True):
            B, H = 16384 // S, 2048 // D
            q, k, v, do = (torch.randn(B, S, H, D, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(4))
            qt, kt, vt, dot = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v, do))
            def f():
                o = fmha.flash_attn_func(q, k, v, causal=causal)
                torch.autograd.grad(o, (q, k, v), do)
            def c():
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                torch.autograd.grad(o, (qt, kt, vt), dot)
            line = f"S={S:5d} D={D:3d} {'causal' if causal else '      '}"
            for name, fn in (("fmha", f), ("cudnn", c)):
                for _ in range(3): fn()
                torch.cuda.synchronize()
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    for _ in range(5): fn()
                    torch.cuda.synchronize()
                agg = collections.Counter()
                for e in prof.events():
                    if e.device_type == torch.autograd.DeviceType.CUDA:
                        agg[short(e.name)] += e.device_time / 5
                tot = sum(agg.values())
                line += f" | {name} {tot:7.1f} us: " + ", ".join(f"{k} {v:.1f}" for k, v in agg.most_common(6))
            print(line, flush=True)
