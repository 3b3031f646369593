# One FA4 forward + backward per shape after a warm-up, for Nsight Compute: its kernels' grid,
# block, registers, shared memory and duration at the benchmark's training shapes.
import sys
import torch
from flash_attn.cute import flash_attn_func as fa4

for d, s, causal in ((128, 4096, False), (128, 4096, True), (64, 4096, False), (256, 4096, False)):
    b, h = 16384 // s, 2048 // d
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    for it in range(2):
        torch.cuda.nvtx.range_push(f"d{d}_s{s}_{'causal' if causal else 'full'}_{it}")
        out = fa4(q, k, v, causal=causal)
        out = out[0] if isinstance(out, tuple) else out
        out.backward(torch.ones_like(out))
        torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()
    print("done", d, s, causal, flush=True)
