import torch, fmha
with torch.no_grad():
    for sk, causal in ((1100, False), (300, True)):
        q = torch.randn(1, 200, 2, 256, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(1, sk, 2, 256, device="cuda", dtype=torch.bfloat16)
        fmha.flash_attn_func(q, k, k, causal=causal)
torch.cuda.synchronize(); print("done")
