# The sm_90a backward after the stmatrix dS^T / P^T stores, the 8-byte dQ staging, dQ split by
# rows at D = 64 and dK after dQ there: every head dim's instance (64 on 128-row blocks, 64 with
# softcap on 64-row blocks, 128, 192 and 256 with kSplitD), atomic and deterministic, causal and
# not, GQA, lengths off the tiles, varlen with an empty sequence.  Run under compute-sanitizer
# with --kernel-name kns=bwd_sm90.
import torch, fmha

def run(b, sq, sk, hq, hk, d, **kw):
    q = torch.randn(b, sq, hq, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(b, sk, hk, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(b, sk, hk, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    out = fmha.flash_attn_func(q, k, v, **kw)
    out.backward(torch.randn_like(out))

run(2, 300, 333, 4, 2, 64)
run(1, 300, 300, 2, 2, 64, causal=True, deterministic=True)
run(1, 130, 260, 2, 2, 64, softcap=30.0)
run(2, 200, 333, 4, 2, 128)
run(1, 140, 140, 2, 2, 128, causal=True, deterministic=True)
run(1, 150, 170, 2, 1, 192, causal=True)
run(1, 200, 130, 2, 2, 256)
run(1, 130, 200, 2, 2, 256, causal=True, deterministic=True)
lens = [5, 0, 77, 130]
cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device="cuda")
for d in (64, 128):
    q, k, v = (torch.randn(int(cu[-1]), 4, d, device="cuda", dtype=torch.float16, requires_grad=True) for _ in range(3))
    out = fmha.flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=True)
    out.backward(torch.randn_like(out))
torch.cuda.synchronize(); print("done")
