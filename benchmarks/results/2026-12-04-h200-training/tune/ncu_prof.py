import sys, torch, fmha
S, D, causal = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "causal"
B, H = 16384 // S, 2048 // D
q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
for _ in range(3):
    fmha.flash_attn_func(q, k, v, causal=causal)
torch.cuda.synchronize()
