# The sm_90a backward at D <= 128 on 64-row query blocks (dK issued after dQ): atomic and
# deterministic, causal and not, softcap, head dims 64 (score mod), 96 and 128, varlen with
# an empty sequence, GQA, lengths off the tiles.
import torch, fmha

def run(b, sq, sk, hq, hk, d, **kw):
    q = torch.randn(b, sq, hq, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(b, sk, hk, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(b, sk, hk, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    out = fmha.flash_attn_func(q, k, v, **kw)
    out.backward(torch.randn_like(out))

run(2, 200, 333, 4, 2, 128)
run(1, 300, 300, 2, 2, 128, causal=True, deterministic=True)
run(1, 257, 190, 2, 1, 96, causal=True)
run(1, 130, 260, 2, 2, 64, softcap=30.0)
run(1, 140, 140, 2, 2, 128, softcap=20.0, deterministic=True)
lens = [5, 0, 77, 130]
cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device="cuda")
q, k, v = (torch.randn(int(cu[-1]), 4, 128, device="cuda", dtype=torch.float16, requires_grad=True) for _ in range(3))
out = fmha.flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=True)
out.backward(torch.randn_like(out))
torch.cuda.synchronize(); print("done")
