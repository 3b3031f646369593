# fp8 at D = 256 with descales of mixed signs (both copies of the key loop in one call), causal and not
import torch, fmha
F8 = torch.float8_e4m3fn
q, k, v = (torch.randn(2, 300, 4, 256, device="cuda").to(F8) for _ in range(3))
qd = torch.tensor([[1.0, -1.0], [0.0, 0.5]], device="cuda")
kd = torch.ones(2, 2, device="cuda")
k, v = k[:, :, :2], v[:, :, :2]
for causal in (False, True):
    fmha.flash_attn_func(q.contiguous(), k.contiguous(), v.contiguous(), causal=causal, q_descale=qd, k_descale=kd)
fmha.flash_attn_func(q, k.contiguous(), v.contiguous(), softmax_scale=-0.05, q_descale=qd, k_descale=kd)
torch.cuda.synchronize()
print("ok")
