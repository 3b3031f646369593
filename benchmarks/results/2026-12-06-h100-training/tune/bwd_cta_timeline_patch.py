# Instrument a copy of bwd_sm90_kernel.h with per-CTA timestamps (device-side clock64 + globaltimer).
import sys, re
path = sys.argv[1]
s = open(path).read()
def sub(old, new, count=1):
    global s
    assert s.count(old) == count, (old, s.count(old))
    s = s.replace(old, new)
s = s.replace("namespace fmha {\nnamespace cuda {\n\nstruct BwdSm90Maps", "namespace fmha {\nnamespace cuda {\n__device__ unsigned long long* g_tune_rec;\n\nstruct BwdSm90Maps", 1)
assert "g_tune_rec" in s
# The entry time right after the kernel's constants (which emit no instructions).
anchor = "  constexpr int kDqThreads = 128 * K::kConsumers + 32;  // the consumers and the dQ warp\n"
sub(anchor, anchor + "  const unsigned long long tc0 = clock64(), tg0 = global_timer_ns();\n")
sub("  if (n_iters > 0) mbar_wait(full_kv, 0);\n", "  if (n_iters > 0) mbar_wait(full_kv, 0);\n  const unsigned long long tc_kv = clock64();\n")
sub("  // Epilogue: dK = scale", "  const unsigned long long tc_loop = clock64();\n  // Epilogue: dK = scale")
sub("""    copy_16_if(gdv + r * p.dv.row_stride + c, sdV + TileO::offset(r, c), ok);
  }
#endif""", """    copy_16_if(gdv + r * p.dv.row_stride + c, sdV + TileO::offset(r, c), ok);
  }
  if (g_tune_rec != nullptr && tid == 128) {
    unsigned smid; asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    const int linear = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    unsigned long long* r = g_tune_rec + 8 * linear;
    r[0] = smid; r[1] = (unsigned long long)(n_block) | ((unsigned long long)(y + gridDim.y * b) << 32);
    r[2] = n_iters; r[3] = tc0; r[4] = tc_kv; r[5] = tc_loop; r[6] = clock64(); r[7] = tg0;
  }
#endif""")

sub("    mbar_wait(full + st, (it / kStages) & 1);\n\n    // S^T = K Q^T", "    mbar_wait(full + st, (it / kStages) & 1);\n    if (it == 0) tc_q0 = clock64();\n\n    // S^T = K Q^T")
sub("    ++it;\n    cur = next(cur);\n  };", "    if (it == 0) tc_it1 = clock64();\n    ++it;\n    cur = next(cur);\n  };")
sub("  Step cur = first;\n  int it = 0;\n", "  Step cur = first;\n  int it = 0;\n  unsigned long long tc_q0 = 0, tc_it1 = 0;\n")
sub("  named_barrier_sync(kBarDkv, 128 * K::kConsumers);\n#pragma unroll\n  for (int rr", "  named_barrier_sync(kBarDkv, 128 * K::kConsumers);\n  const unsigned long long tc_e1 = clock64();\n#pragma unroll\n  for (int rr")
sub("  named_barrier_sync(kBarDkv, 128 * K::kConsumers);\n  T* gdk", "  named_barrier_sync(kBarDkv, 128 * K::kConsumers);\n  const unsigned long long tc_e2 = clock64();\n  T* gdk")
sub("    r[2] = n_iters; r[3] = tc0; r[4] = tc_kv; r[5] = tc_loop; r[6] = clock64(); r[7] = tg0;\n  }",
    "    r[2] = n_iters; r[3] = tc0; r[4] = tc_kv; r[5] = tc_loop; r[6] = clock64(); r[7] = tg0;\n    r[8] = tc_q0; r[9] = tc_it1; r[10] = tc_e1; r[11] = tc_e2;\n  }\n  if (g_tune_rec != nullptr && tid == 256) {\n    const int linear = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);\n    g_tune_rec[16 * linear + 12] = tc_loop; g_tune_rec[16 * linear + 13] = clock64();\n  }")
s = s.replace("unsigned long long* r = g_tune_rec + 8 * linear;", "unsigned long long* r = g_tune_rec + 16 * linear;")
open(path, "w").write(s)
