"""fmha against torch's CPU flash attention, calls alternating in one process (the fair
comparison on a machine whose cores change speed between windows), minimum of 20 calls each.

    FMHA_NUM_THREADS=1 python tools/cpu_single_thread.py bfloat16,float32 f,fb [128,1024]

argv: dtypes; modes (f = forward, fb = forward + backward); optionally the sequence lengths
of the benchmark's CPU shapes to keep.  FMHA_NUM_THREADS=1 also sets torch to one thread.
Prints torch's and fmha's times in ms and their ratio (above 1: fmha faster).
"""
import torch, time, sys, fmha
from torch.nn.attention import sdpa_kernel, SDPBackend
F=torch.nn.functional
import os
if os.environ.get("FMHA_NUM_THREADS")=="1": torch.set_num_threads(1)
dts = [getattr(torch, x) for x in sys.argv[1].split(",")]
modes = sys.argv[2].split(",") if len(sys.argv)>2 else ["f","fb"]
shapes=[(8,128,4,64),(4,256,4,64),(2,512,4,64),(1,1024,4,64),(8,128,2,128),(4,256,2,128),(2,512,2,128),(1,1024,2,128)]
if len(sys.argv)>3: shapes=[s for s in shapes if s[1] in [int(x) for x in sys.argv[3].split(",")]]
def mk(fn):
    def run(n):
        ts=[]
        for _ in range(n):
            a=time.perf_counter(); fn(); ts.append(time.perf_counter()-a)
        return min(ts)
    return run
for dt in dts:
  for causal in (False,True):
    for (B,S,H,D) in shapes:
      q,k,v,do=(torch.randn(B,H,S,D,dtype=dt,requires_grad=True) for _ in range(4))
      qf,kf,vf,dof=(x.detach().transpose(1,2).contiguous().requires_grad_() for x in (q,k,v,do))
      line=f"{str(dt)[6:]:8} B={B} S={S:4} H={H} D={D:3} c={int(causal)}"
      for mode in modes:
        def tf():
          with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            o=F.scaled_dot_product_attention(q,k,v,is_causal=causal)
            if mode=="fb": torch.autograd.grad(o,(q,k,v),do)
        def ff():
          o=fmha.flash_attn_func(qf,kf,vf,causal=causal)
          if mode=="fb": torch.autograd.grad(o,(qf,kf,vf),dof)
        rt, rf = mk(tf), mk(ff)
        rt(3); rf(3)
        bt=bf=1e9
        for _ in range(4):
          bt=min(bt,rt(5)); bf=min(bf,rf(5))
        line+=f" | {mode:2} torch {bt*1e3:7.3f} fmha {bf*1e3:7.3f} x{bt/bf:5.2f}"
      print(line, flush=True)
