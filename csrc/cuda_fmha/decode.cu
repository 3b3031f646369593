// The CUDA decode entry point (flash_attn_with_kvcache): append the new tokens, then the
// split-KV tensor-core kernel (fp16/bf16 queries) or the warp-per-row fp32 kernel, then the
// split combine.  The number of splits is chosen here, from shapes only (device-resident
// lengths are never read), and fmha_decode_workspace_size() asks the same function.
#include <cuda_runtime.h>

#include <type_traits>

#include "../common/backend.h"
#include "../common/decode_plan.h"
#include "../common/error.h"
#include "../common/quant.h"
#include "decode_rowwise.h"
#include "instances/instances.h"
#include "launch.h"

namespace fmha {
namespace cuda {

namespace {

constexpr int kThreadsRow = 32 * kRowWarps;

// f(DecodeTypes<T, Elem, kCache>{}) for the query dtype and the cache element of p.
template <class F>
void with_types(const fmha_decode_params& p, F&& f) {
  with_decode_types<__half, __nv_bfloat16>(p, f);
}

// Whether p runs the wide 8-bit kernel (DecodeWideConfig): 8-bit cache, D <= 128, and a
// device that lets a block opt in to its shared memory (sm90, sm100; not sm80 or 99 KB parts).
bool use_wide(const fmha_decode_params& p) {
  const int d = kernel_head_dim(p.head_dim, kDecodeHeadDims);
  if (!quantized_cache(p) || d == 0 || d > 128) return false;
  const int need = d == 64 ? DecodeWideConfig<__half, CacheKind::kFp8, 64>::kSmemBytes
                           : DecodeWideConfig<__half, CacheKind::kFp8, 128>::kSmemBytes;
  return device_smem_optin() >= need;
}

// f(DecodeConfig{}) of the tensor-core kernel for p (fp16/bf16 queries).
template <class T, CacheKind C, int D, class F>
void with_width(const fmha_decode_params& p, F&& f) {
  if constexpr (C != CacheKind::kPlain && kHasDecodeWide<D>)
    if (use_wide(p)) return f(DecodeWideConfig<T, C, D>{});
  return f(DecodeConfig<T, C, D>{});
}
template <class T, CacheKind C, class F>
void with_dim(const fmha_decode_params& p, F&& f) {
  with_head_dim<64, 128, 256>(decode_head_dim(p.head_dim),
                              [&](auto d) { with_width<T, C, decltype(d)::value>(p, f); });
}

// f(DecodeConfig{}) for p, whose queries are fp16/bf16.
template <class F>
void with_config(const fmha_decode_params& p, F&& f) {
  with_types(p, [&](auto types) {
    using Ty = decltype(types);
    if constexpr (!std::is_same_v<typename Ty::T, float>) with_dim<typename Ty::T, Ty::kCache>(p, f);
  });
}

// A wave of the cache stream: one CTA per SM keeps a contiguous 16-bit cache at the copy
// rate; paged caches (a page lookup per block) want two, 8-bit caches at D <= 128 (more
// instructions per byte) three 4-warp CTAs or one 12-warp CTA (DecodeTraits::kMinBlocks,
// kWide), and 8-bit splits keep at least 16 blocks (8 otherwise).  Measured on an H200
// (tools/tune/decode_splits.py, docs/tuning.md): contiguous B = 1, L = 8k ran at 1.43 TB/s
// with one per SM against 1.23 with two, paged-16 B = 1, L = 128k at 3.75 TB/s with two
// against 2.85 with one, and fp8 B = 8, L = 32k at 3.3 TB/s with three 4-warp CTAs against
// 1.8 with one (the wide kernel: docs/tuning.md, "The wide 8-bit kernel").
DecodePlan plan(const fmha_decode_params& p) {
  const bool quant = quantized_cache(p), narrow = kernel_head_dim(p.head_dim, kDecodeHeadDims) <= 128;
  const int per_sm = quant ? (narrow ? (use_wide(p) ? 1 : 3) : 2) : p.block_table != nullptr ? 2 : 1;
  return DecodePlan::make(p, (int64_t)p.batch * p.num_heads_k * DecodeWork::m_tiles(p, kDecodeRows),
                          (int64_t)device_sm_count() * per_sm, quant ? 16 : 8);
}

int grid_size(int64_t items, int per_block) { return (int)((items + per_block - 1) / per_block); }

}  // namespace

size_t decode_workspace_size(const fmha_decode_params& p) {
  const DecodePlan pl = plan(p);
  return pl.o_bytes + pl.lse_bytes;
}

void decode(const fmha_decode_params& p, void* stream) {
  if (p.batch == 0) return;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const bool quant = quantized_cache(p);
  if (p.dtype != FMHA_DTYPE_FLOAT32) {
    check_vector_layout(p.q, "q", p.head_dim, 2);
    check_vector_layout(p.out, "out", p.head_dim, 2);
    if (p.seqlen_new > 0) {
      check_vector_layout(p.k_new, "k_new", p.head_dim, 2);
      check_vector_layout(p.v_new, "v_new", p.head_dim, 2);
    }
    check_vector_layout(p.k_cache, "k_cache", p.head_dim, quant ? 1 : 2);
    check_vector_layout(p.v_cache, "v_cache", p.head_dim, quant ? 1 : 2);
  }
  if (p.batch > 65535 || p.num_heads_k > 65535 ||
      (int64_t)DecodeWork::m_tiles(p, kDecodeRows) * kMaxDecodeSplits > INT32_MAX)
    FMHA_UNSUPPORTED("decode grid too large: batch %d and num_heads_k %d (at most 65535 each), seqlen_q %d",
                     p.batch, p.num_heads_k, p.seqlen_q);

  // 1. The new tokens go into the cache first (stream order makes them visible below).
  if (p.seqlen_new > 0) {
    with_types(p, [&](auto types) {
      using Ty = decltype(types);
      const int64_t items = (int64_t)p.batch * p.seqlen_new * p.num_heads_k;
      decode_append_kernel<typename Ty::T, typename Ty::Elem><<<grid_size(items, kRowWarps), kThreadsRow, 0, s>>>(p);
    });
    check_cuda(cudaGetLastError(), "decode_append_kernel launch");
  }
  if (p.seqlen_q == 0 || (p.cu_seqlens_q != nullptr && p.total_q == 0)) return;

  // 2. Attention: prefill chunks over a paged cache on the sm_90a forward where it takes
  // them (fwd_paged_sm90, dispatch.cu), else the kernels here.
  if (fwd_paged_sm90(p, s)) return;
  if (p.dtype == FMHA_DTYPE_FLOAT32) {
    with_types(p, [&](auto types) {
      using Ty = decltype(types);
      if constexpr (std::is_same_v<typename Ty::T, float>)
        decode_rowwise_kernel<typename Ty::Elem>
            <<<dim3(grid_size(p.seqlen_q, kRowWarps), p.num_heads_q, p.batch), kThreadsRow, 0, s>>>(p);
    });
    check_cuda(cudaGetLastError(), "decode_rowwise_kernel launch");
    return;
  }
  const DecodePlan pl = plan(p);
  float* o_part = static_cast<float*>(p.workspace);
  float* lse_part = reinterpret_cast<float*>(static_cast<char*>(p.workspace) + pl.o_bytes);
  with_config(p, [&](auto traits) { run_decode<decltype(traits)>(p, pl.splits, o_part, lse_part, s); });

  // 3. Splits merged by LSE.  Behind the one-CTA-per-SM kernel of contiguous 16-bit caches
  // the combine is its programmatic dependent: its blocks are placed beside the decode CTAs
  // while they stream and start as the last one ends.  Graph timing on one H100 (2026-12-07,
  // tools/tune/decode_graph_ab.py): B = 1, L = 8k 18.8 -> 18.0 us, 32k 51.5 -> 51.2, level
  // elsewhere; behind the paged and 8-bit kernels (two or three CTAs per SM, or one of 12
  // warps) it was 0.3-1.1 us slower at B = 1, so they keep the plain launch.
  if (pl.splits > 1) {
    const int64_t rows = decode_partial_rows(p);
    if (rows > INT32_MAX)
      FMHA_UNSUPPORTED("decode combine grid too large: %lld output rows (batch x heads x seqlen_q, or heads x total_q)",
                       (long long)rows);
    const int parts = decode_combine_parts(pl.splits);
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3((unsigned)grid_size(rows * parts, kCombineWarps));
    cfg.blockDim = dim3(32 * kCombineWarps);
    cfg.stream = s;
    cfg.attrs = &attr;
    cfg.numAttrs = !quant && p.block_table == nullptr && device_cc_major() >= 9 ? 1 : 0;
    with_types(p, [&](auto types) {
      using T = typename decltype(types)::T;
      if constexpr (!std::is_same_v<T, float>)
        check_cuda(cudaLaunchKernelEx(&cfg, decode_combine_kernel<T>, p, static_cast<const float*>(o_part),
                                      static_cast<const float*>(lse_part), pl.splits, parts),
                   "decode_combine_kernel launch");
    });
  }
}

}  // namespace cuda
}  // namespace fmha
