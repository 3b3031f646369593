# Eager (events around back-to-back calls, the benchmark's timing) against CUDA-graph time
# (device only) of fmha and cuDNN forwards at the short training shapes.
import sys, torch, fmha
from fmha.bench import timing
from torch.nn.attention import sdpa_kernel, SDPBackend
F = torch.nn.functional
dev = torch.device("cuda")
for S in (512, 1024):
    for D in (64, 128, 256):
        for causal in (False, True):
            B, H = 16384 // S, 2048 // D
            sets = [[torch.randn(B, S, H, D, device=dev, dtype=torch.bfloat16) for _ in range(3)] for _ in range(3)]
            tsets = [[x.transpose(1, 2) for x in s] for s in sets]
            ff = [lambda s=s: fmha.flash_attn_func(*s, causal=causal) for s in sets]
            def cud(s):
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    return F.scaled_dot_product_attention(*s, is_causal=causal)
            cf = [lambda s=s: cud(s) for s in tsets]
            flops = 4 * B * H * S * S * D / (2 if causal else 1)
            r = {}
            for name, fns in (("fmha", ff), ("cudnn", cf)):
                e = timing.median_ms(fns, dev, budget_s=0.3)
                g = timing.median_ms_graph(fns, dev, budget_s=0.3)
                r[name] = (e, g)
            line = f"S={S:5d} D={D:3d} {'causal' if causal else '      '}"
            for name, (e, g) in r.items():
                line += f" | {name} eager {e*1e3:7.1f} us ({flops/e/1e9:5.0f}) graph {g*1e3:7.1f} us ({flops/g/1e9:5.0f})"
            line += f" | eager ratio {r['cudnn'][0]/r['fmha'][0]:.2f} graph ratio {r['cudnn'][1]/r['fmha'][1]:.2f}"
            print(line, flush=True)
