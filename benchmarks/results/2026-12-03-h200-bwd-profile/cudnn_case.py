# cuDNN's SDPA forward + backward once per shape, for ncu.
import sys, torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
for spec in sys.argv[1:]:
    S, D, causal = spec.split(",")
    S, D, causal = int(S), int(D), causal == "c"
    B, H = 16384 // S, 2048 // D
    q, k, v, do = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(4))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    torch.autograd.grad(o, (q, k, v), do)
    torch.cuda.synchronize()
