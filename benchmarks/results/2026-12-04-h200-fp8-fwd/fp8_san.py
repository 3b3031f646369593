# Small fp8 calls for compute-sanitizer: fixed length (D 64/128/256, causal, softcap), varlen
# with an empty sequence and GQA, a call with several tiles per CTA, and the long tiles
# (256-key blocks at D = 64 from 1024 keys a tile, 192 at D = 128 from 4096), last blocks partial.
import torch, fmha
from fmha.flash_attn_interface import flash_attn_func, flash_attn_varlen_func
F8 = torch.float8_e4m3fn
dev = "cuda"
for d in (64, 128, 256):
    q, k, v = (torch.randn(2, 200, 4, d, device=dev).to(F8) for _ in range(3))
    ds = torch.rand(2, 4, device=dev) + 0.5
    flash_attn_func(q, k, v, causal=True, q_descale=ds, k_descale=ds, v_descale=ds)
    flash_attn_func(q, k, v, softcap=5.0, window_size=(50, 10))
cu = torch.tensor([0, 70, 70, 333], device=dev, dtype=torch.int32)
q = torch.randn(333, 8, 128, device=dev).to(F8)
k, v = (torch.randn(333, 2, 128, device=dev).to(F8) for _ in range(2))
flash_attn_varlen_func(q, k, v, cu, cu, 263, 263, causal=True)
# Several tiles per CTA (320 tiles): the rings and the transposing warps' end run across tiles.
q, k, v = (torch.randn(4, 520, 16, 64, device=dev).to(F8) for _ in range(3))
flash_attn_func(q, k, v)
# The long tiles: full, causal (twice the keys), softcap with a window, several tiles per CTA.
for d, keys in ((64, 2100), (128, 4200)):
    q = torch.randn(1, 300, 4, d, device=dev).to(F8)
    k, v = (torch.randn(1, 2 * keys, 2, d, device=dev).to(F8) for _ in range(2))
    flash_attn_func(q, k[:, :keys], v[:, :keys])
    flash_attn_func(q, k, v, causal=True)
    flash_attn_func(q, k, v, softcap=5.0, window_size=(keys - 100, 300))
q, k, v = (torch.randn(2, 2100, 8, 64, device=dev).to(F8) for _ in range(3))
flash_attn_func(q, k, v)
torch.cuda.synchronize()
print("ok")
