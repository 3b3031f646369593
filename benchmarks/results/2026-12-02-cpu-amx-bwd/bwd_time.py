import torch, time, sys, fmha
torch.set_num_threads(1)
B,S,H,D,causal=[int(x) for x in sys.argv[1:6]]
q,k,v,do=(torch.randn(B,S,H,D,dtype=torch.bfloat16) for _ in range(4))
q.requires_grad_(); k.requires_grad_(); v.requires_grad_()
o=fmha.flash_attn_func(q,k,v,causal=bool(causal))
ts=[]
for _ in range(int(sys.argv[7]) if len(sys.argv)>7 else 15):
    a=time.perf_counter(); torch.autograd.grad(o,(q,k,v),do,retain_graph=True); ts.append(time.perf_counter()-a)
print(f"{sys.argv[6]} B={B} S={S} H={H} D={D} c={causal} bwd min {min(ts)*1e3:.2f} ms")
