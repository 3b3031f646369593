// The HIP decode entry point (flash_attn_with_kvcache): append the new tokens, then the
// split-KV matrix-core kernel (fp16/bf16 queries) or the wave-per-row fp32 kernel, then the
// split combine -- the CUDA backend's csrc/cuda_fmha/decode.cu, same semantics, same
// workspace contract.  The number of splits is chosen here, from shapes only
// (device-resident lengths are never read), and fmha_decode_workspace_size() asks the same
// function.
#include <hip/hip_runtime.h>

#include <type_traits>

#include "../common/backend.h"
#include "../common/decode_plan.h"
#include "../common/error.h"
#include "../common/quant.h"
#include "decode_rowwise.h"
#include "instances/instances.h"
#include "launch.h"

namespace fmha {
namespace hip {

namespace {

// f(DecodeTypes<T, Elem, kCache>{}) for the query dtype and the cache element of p.
template <class F>
void with_types(const fmha_decode_params& p, F&& f) {
  with_decode_types<f16, bf16>(p, f);
}

// f(DecodeConfig{}) of the matrix-core kernel for p (fp16/bf16 queries); head dims pad to
// the next instance (decode_head_dim).
template <class T, CacheKind C, class F>
void with_dim(const fmha_decode_params& p, F&& f) {
  with_head_dim<64, 128, 256>(decode_head_dim(p.head_dim),
                              [&](auto d) { f(DecodeConfig<T, C, decltype(d)::value>{}); });
}

// f(DecodeConfig{}) for p, whose queries are fp16/bf16.
template <class F>
void with_config(const fmha_decode_params& p, F&& f) {
  with_types(p, [&](auto types) {
    using Ty = decltype(types);
    if constexpr (!std::is_same_v<typename Ty::T, float>) with_dim<typename Ty::T, Ty::kCache>(p, f);
  });
}

// The CUDA backend's split rule (a wave of one workgroup per CU for contiguous caches, two
// for paged ones; at least 8 blocks per split), measured on an H200 (docs/tuning.md), not
// on AMD hardware.
DecodePlan plan(const fmha_decode_params& p) {
  return DecodePlan::make(p, (int64_t)p.batch * p.num_heads_k * DecodeWork::m_tiles(p),
                          (int64_t)device_sm_count() * (p.block_table != nullptr ? 2 : 1), 8);
}

int grid_size(int64_t items, int per_block) { return (int)((items + per_block - 1) / per_block); }

}  // namespace

size_t decode_workspace_size(const fmha_decode_params& p) {
  const DecodePlan pl = plan(p);
  return pl.o_bytes + pl.lse_bytes;
}

void decode(const fmha_decode_params& p, void* stream) {
  if (p.batch == 0) return;
  hipStream_t s = static_cast<hipStream_t>(stream);
  const bool quant = quantized_cache(p);
  if (p.dtype != FMHA_DTYPE_FLOAT32) {
    check_vector_layout(p.q, "q", p.head_dim);
    check_vector_layout(p.out, "out", p.head_dim);
    if (p.seqlen_new > 0) {
      check_vector_layout(p.k_new, "k_new", p.head_dim);
      check_vector_layout(p.v_new, "v_new", p.head_dim);
    }
    check_vector_layout(p.k_cache, "k_cache", p.head_dim, quant ? 1 : 2);
    check_vector_layout(p.v_cache, "v_cache", p.head_dim, quant ? 1 : 2);
  }
  if (p.batch > 65535 || p.num_heads_k > 65535 || (int64_t)DecodeWork::m_tiles(p) * kMaxDecodeSplits > INT32_MAX)
    FMHA_UNSUPPORTED("decode grid too large: batch %d and num_heads_k %d (at most 65535 each), seqlen_q %d",
                     p.batch, p.num_heads_k, p.seqlen_q);

  // 1. The new tokens go into the cache first (stream order makes them visible below).
  if (p.seqlen_new > 0) {
    with_types(p, [&](auto types) {
      using Ty = decltype(types);
      const int64_t items = (int64_t)p.batch * p.seqlen_new * p.num_heads_k;
      decode_append_kernel<typename Ty::T, typename Ty::Elem><<<grid_size(items, kRowWaves), kRowThreads, 0, s>>>(p);
    });
    check_hip(hipGetLastError(), "decode_append_kernel launch");
  }
  if (p.seqlen_q == 0 || (p.cu_seqlens_q != nullptr && p.total_q == 0)) return;

  // 2. Attention.
  if (p.dtype == FMHA_DTYPE_FLOAT32) {
    with_types(p, [&](auto types) {
      using Ty = decltype(types);
      if constexpr (std::is_same_v<typename Ty::T, float>)
        decode_rowwise_kernel<typename Ty::Elem>
            <<<dim3(grid_size(p.seqlen_q, kRowWaves), p.num_heads_q, p.batch), kRowThreads, 0, s>>>(p);
    });
    check_hip(hipGetLastError(), "decode_rowwise_kernel launch");
    return;
  }
  const DecodePlan pl = plan(p);
  float* o_part = static_cast<float*>(p.workspace);
  float* lse_part = reinterpret_cast<float*>(static_cast<char*>(p.workspace) + pl.o_bytes);
  with_config(p, [&](auto traits) { run_decode<decltype(traits)>(p, pl.splits, o_part, lse_part, s); });

  // 3. Splits merged by LSE.
  if (pl.splits > 1) {
    const int64_t rows = decode_partial_rows(p);
    if (rows > INT32_MAX)
      FMHA_UNSUPPORTED("decode combine grid too large: %lld output rows (batch x heads x seqlen_q, or heads x total_q)",
                       (long long)rows);
    const int parts = std::min(decode_combine_parts(pl.splits), kCombineWaves);
    with_types(p, [&](auto types) {
      using T = typename decltype(types)::T;
      if constexpr (!std::is_same_v<T, float>)
        decode_combine_kernel<T><<<(unsigned)grid_size(rows * parts, kCombineWaves), kCombineWaves * kWaveSize, 0, s>>>(
            p, o_part, lse_part, pl.splits, parts);
    });
    check_hip(hipGetLastError(), "decode_combine_kernel launch");
  }
}

}  // namespace hip
}  // namespace fmha
