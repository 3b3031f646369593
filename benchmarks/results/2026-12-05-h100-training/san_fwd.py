"""sm_90a forward cases for compute-sanitizer: the key loop in runs by mask (masked prefix,
whole blocks, masked suffix under a window), the long tiles, the score-mod instance (a
negative scale), fp8."""
import torch, fmha
def run(b, sq, sk, hq, hk, d, dtype=torch.bfloat16, **kw):
    q = torch.randn(b, sq, hq, d, device="cuda", dtype=dtype)
    k = torch.randn(b, sk, hk, d, device="cuda", dtype=dtype)
    v = torch.randn(b, sk, hk, d, device="cuda", dtype=dtype)
    with torch.no_grad():
        fmha.flash_attn_func(q, k, v, **kw)
run(1, 700, 1100, 4, 2, 128, window_size=(300, 100))
run(1, 700, 1100, 4, 2, 96, causal=True)
run(1, 300, 1100, 2, 2, 256, window_size=(20, 20))
run(1, 300, 900, 4, 2, 192, causal=True, softcap=10.0)
run(1, 200, 8300, 2, 2, 128)            # 176-key blocks
run(1, 250, 8300, 4, 2, 64)             # D = 64's 192-row tiles (three consumers)
run(2, 300, 500, 4, 2, 64, causal=True) # D = 64's 128-row tiles (one loop)
run(1, 300, 600, 4, 2, 128, softmax_scale=-0.2)
q = torch.randn(1, 300, 4, 128, device="cuda").to(torch.float8_e4m3fn)
k = torch.randn(1, 700, 2, 128, device="cuda").to(torch.float8_e4m3fn)
fmha.flash_attn_func(q, k, k, causal=True)
torch.cuda.synchronize()
print("forward sanitize cases done")
