#include "validate.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>

#include "error.h"
#include "quant.h"

namespace fmha {

namespace {

// Size of the first published layout of each params struct.  A caller compiled against an
// older header passes a smaller struct_size; the fields it lacks read as zero.
// fmha_fwd_params grew the fp8 forward's descales and workspace after its first layout.
constexpr uint32_t kFwdParamsV1 = offsetof(fmha_fwd_params, q_descale);
constexpr uint32_t kBwdParamsV1 = sizeof(fmha_bwd_params);
// fmha_decode_params grew cu_seqlens_q and total_q after its first layout.
constexpr uint32_t kDecodeParamsV1 = offsetof(fmha_decode_params, cu_seqlens_q);

template <class Params>
Params read_sized(const Params* p, uint32_t v1_size, const char* name) {
  FMHA_REQUIRE(p != nullptr, "%s: params is NULL", name);
  FMHA_REQUIRE(p->struct_size >= v1_size && p->struct_size <= sizeof(Params),
               "%s: struct_size is %u, expected %u (call %s_init, or rebuild against this "
               "fmha.h)",
               name, p->struct_size, (unsigned)sizeof(Params), name);
  Params out;
  std::memset(&out, 0, sizeof(out));
  std::memcpy(&out, p, p->struct_size);
  return out;
}

void check_tensor(const fmha_tensor& t, const char* name, bool needed) {
  FMHA_REQUIRE(!needed || t.data != nullptr, "%s.data is NULL", name);
  FMHA_REQUIRE(t.batch_stride >= 0 && t.row_stride >= 0 && t.head_stride >= 0,
               "%s strides must be >= 0 (got batch %lld, row %lld, head %lld)", name,
               (long long)t.batch_stride, (long long)t.row_stride, (long long)t.head_stride);
}

// fp8: the forward takes FMHA_DTYPE_FLOAT8_E4M3 too (validate(fmha_fwd_params)).
void check_device_dtype(fmha_device device, fmha_dtype dtype, bool fp8 = false) {
  FMHA_REQUIRE(device == FMHA_DEVICE_CPU || device == FMHA_DEVICE_CUDA || device == FMHA_DEVICE_HIP,
               "device %d is not one of FMHA_DEVICE_CPU, _CUDA, _HIP", (int)device);
  FMHA_REQUIRE(dtype == FMHA_DTYPE_FLOAT32 || dtype == FMHA_DTYPE_FLOAT16 || dtype == FMHA_DTYPE_BFLOAT16 ||
                   (fp8 && dtype == FMHA_DTYPE_FLOAT8_E4M3),
               "dtype %d is not one of FMHA_DTYPE_FLOAT32, _FLOAT16, _BFLOAT16%s", (int)dtype,
               fp8 ? ", _FLOAT8_E4M3" : "");
}

void check_heads(int32_t batch, int32_t heads_q, int32_t heads_k, int32_t head_dim) {
  FMHA_REQUIRE(batch >= 0, "batch must be >= 0 (got %d)", batch);
  FMHA_REQUIRE(heads_q >= 1 && heads_k >= 1, "num_heads_q and num_heads_k must be >= 1 (got %d, %d)", heads_q,
               heads_k);
  FMHA_REQUIRE(heads_q % heads_k == 0, "num_heads_q (%d) must be a multiple of num_heads_k (%d)", heads_q, heads_k);
  FMHA_REQUIRE(head_dim >= 1 && head_dim <= FMHA_MAX_HEAD_DIM, "head_dim must be between 1 and %d (got %d)",
               FMHA_MAX_HEAD_DIM, head_dim);
}

void check_scores(float scale, float softcap, int32_t window_left, int32_t window_right, int64_t alibi_batch_stride) {
  FMHA_REQUIRE(std::isfinite(scale), "scale must be finite (got %g)", (double)scale);
  FMHA_REQUIRE(std::isfinite(softcap) && softcap >= 0.f, "softcap must be finite and >= 0, 0 disabling it (got %g)",
               (double)softcap);
  FMHA_REQUIRE(window_left >= -1 && window_right >= -1,
               "window_left and window_right must be >= -1, -1 meaning unbounded (got %d, %d)", window_left,
               window_right);
  FMHA_REQUIRE(alibi_batch_stride >= 0, "alibi_batch_stride must be >= 0 (got %lld)", (long long)alibi_batch_stride);
}

void check_problem(fmha_device device, const fmha_problem& p, bool fp8 = false) {
  check_device_dtype(device, p.dtype, fp8);
  check_heads(p.batch, p.num_heads_q, p.num_heads_k, p.head_dim);
  FMHA_REQUIRE(p.seqlen_q >= 0 && p.seqlen_k >= 0, "seqlen_q and seqlen_k must be >= 0 (got %d, %d)",
               p.seqlen_q, p.seqlen_k);
  const bool varlen = p.cu_seqlens_q != nullptr;
  FMHA_REQUIRE(varlen == (p.cu_seqlens_k != nullptr),
               "cu_seqlens_q and cu_seqlens_k must be given together (varlen) or both be NULL");
  if (varlen) {
    FMHA_REQUIRE(p.total_q >= 0 && p.total_k >= 0, "total_q and total_k must be >= 0 (got %d, %d)",
                 p.total_q, p.total_k);
  }
  check_scores(p.scale, p.softcap, p.window_left, p.window_right, p.alibi_batch_stride);
  FMHA_REQUIRE(p.mask_align == FMHA_ALIGN_BOTTOM_RIGHT || p.mask_align == FMHA_ALIGN_TOP_LEFT,
               "mask_align %d is not FMHA_ALIGN_BOTTOM_RIGHT or FMHA_ALIGN_TOP_LEFT", (int)p.mask_align);
  FMHA_REQUIRE(std::isfinite(p.dropout_p) && p.dropout_p >= 0.f && p.dropout_p < 1.f,
               "dropout_p must be in [0, 1) (got %g)", (double)p.dropout_p);
}

// Whether any element is read or written at all.
bool has_work(const fmha_problem& p) {
  const bool varlen = p.cu_seqlens_q != nullptr;
  return p.batch > 0 && (varlen ? p.total_q > 0 : p.seqlen_q > 0);
}

bool has_keys(const fmha_problem& p) {
  const bool varlen = p.cu_seqlens_q != nullptr;
  return p.batch > 0 && (varlen ? p.total_k > 0 : p.seqlen_k > 0);
}

}  // namespace

fmha_fwd_params read_params(const fmha_fwd_params* p) {
  return read_sized(p, kFwdParamsV1, "fmha_fwd_params");
}
fmha_bwd_params read_params(const fmha_bwd_params* p) {
  return read_sized(p, kBwdParamsV1, "fmha_bwd_params");
}
fmha_decode_params read_params(const fmha_decode_params* p) {
  return read_sized(p, kDecodeParamsV1, "fmha_decode_params");
}

void validate(const fmha_fwd_params& p) {
  check_problem(p.device, p.problem, true);
  const bool work = has_work(p.problem), keys = has_keys(p.problem);
  check_tensor(p.q, "q", work);
  check_tensor(p.k, "k", work && keys);
  check_tensor(p.v, "v", work && keys);
  check_tensor(p.out, "out", work);
  check_tensor(p.probs, "probs", false);
  if (p.problem.dtype != FMHA_DTYPE_FLOAT8_E4M3) return;
  if (p.device != FMHA_DEVICE_CUDA)
    FMHA_UNSUPPORTED("the fp8 forward (dtype FMHA_DTYPE_FLOAT8_E4M3) runs on CUDA GPUs with compute capability 9.0 "
                     "only, not on device %d",
                     (int)p.device);
  FMHA_REQUIRE(p.problem.dropout_p == 0.f, "the fp8 forward has no dropout (dropout_p is %g)",
               (double)p.problem.dropout_p);
  FMHA_REQUIRE(p.probs.data == nullptr, "the fp8 forward does not return probs");
  FMHA_REQUIRE(p.problem.seqused_k == nullptr, "the fp8 forward does not take seqused_k");
  for (auto [d, name] : {std::pair{&p.q_descale, "q_descale"}, {&p.k_descale, "k_descale"}, {&p.v_descale, "v_descale"}})
    FMHA_REQUIRE(d->batch_stride >= 0 && d->head_stride >= 0, "%s strides must be >= 0 (got batch %lld, head %lld)",
                 name, (long long)d->batch_stride, (long long)d->head_stride);
}

void validate(const fmha_bwd_params& p) {
  check_problem(p.device, p.problem);
  const bool work = has_work(p.problem), keys = has_keys(p.problem);
  check_tensor(p.q, "q", work);
  check_tensor(p.k, "k", work && keys);
  check_tensor(p.v, "v", work && keys);
  check_tensor(p.out, "out", work);
  check_tensor(p.dout, "dout", work);
  check_tensor(p.dq, "dq", work);
  check_tensor(p.dk, "dk", keys);
  check_tensor(p.dv, "dv", keys);
  FMHA_REQUIRE(!work || p.lse != nullptr, "lse is NULL: the backward pass needs the forward's LSE");
}

void validate(const fmha_decode_params& p) {
  check_device_dtype(p.device, p.dtype, false);
  check_heads(p.batch, p.num_heads_q, p.num_heads_k, p.head_dim);
  check_scores(p.scale, p.softcap, p.window_left, p.window_right, p.alibi_batch_stride);
  FMHA_REQUIRE(p.seqlen_q >= 0, "seqlen_q must be >= 0 (got %d)", p.seqlen_q);
  const bool quantized = quantized_cache(p);
  FMHA_REQUIRE(p.cache_dtype == p.dtype || quantized,
               "cache_dtype %d must equal dtype (%d) or be FMHA_DTYPE_FLOAT8_E4M3 / FMHA_DTYPE_INT8", (int)p.cache_dtype,
               (int)p.dtype);
  if (quantized) {
    FMHA_REQUIRE(p.scaling == FMHA_SCALE_PER_HEAD || p.scaling == FMHA_SCALE_PER_TOKEN,
                 "a quantized cache needs scaling FMHA_SCALE_PER_HEAD or FMHA_SCALE_PER_TOKEN (got %d)",
                 (int)p.scaling);
    FMHA_REQUIRE(p.k_scale != nullptr && p.v_scale != nullptr, "a quantized cache needs k_scale and v_scale");
  } else {
    FMHA_REQUIRE(p.scaling == FMHA_SCALE_NONE, "scaling must be FMHA_SCALE_NONE for a cache of dtype %d",
                 (int)p.cache_dtype);
  }
  const bool work = p.batch > 0 && p.seqlen_q > 0;
  FMHA_REQUIRE(p.cache_batch >= 1 && p.cache_seqlen >= 1,
               "cache_batch and cache_seqlen (pages and page size when paged) must be >= 1 (got %d, %d)",
               p.cache_batch, p.cache_seqlen);
  if (p.block_table != nullptr) {
    FMHA_REQUIRE(p.cache_seqlen % 16 == 0, "page size (cache_seqlen) must be a multiple of 16 (got %d)",
                 p.cache_seqlen);
    FMHA_REQUIRE(p.max_pages >= 1 && p.block_table_stride >= p.max_pages,
                 "block_table needs max_pages >= 1 and block_table_stride >= max_pages (got %d, %lld)", p.max_pages,
                 (long long)p.block_table_stride);
    FMHA_REQUIRE(p.cache_batch_idx == nullptr, "cache_batch_idx cannot be combined with a paged cache (block_table)");
  }
  FMHA_REQUIRE(!work || p.cache_seqlens != nullptr, "cache_seqlens is NULL: the decode needs each cache's length");
  FMHA_REQUIRE(p.seqlen_new >= 0, "seqlen_new must be >= 0 (got %d)", p.seqlen_new);
  const int64_t capacity = p.block_table ? (int64_t)p.max_pages * p.cache_seqlen : p.cache_seqlen;
  FMHA_REQUIRE(p.seqlen_new <= capacity, "%d new tokens do not fit a cache of %lld positions per sequence",
               p.seqlen_new, (long long)capacity);
  if (p.rotary_dim != 0) {
    FMHA_REQUIRE(p.rotary_dim > 0 && p.rotary_dim % 2 == 0 && p.rotary_dim <= p.head_dim,
                 "rotary_dim must be even and between 2 and head_dim %d (got %d)", p.head_dim, p.rotary_dim);
    FMHA_REQUIRE(p.rotary_cos != nullptr && p.rotary_sin != nullptr && p.seqlen_ro >= 1,
                 "rotary needs rotary_cos, rotary_sin and seqlen_ro >= 1");
  }
  FMHA_REQUIRE(p.num_splits >= 0, "num_splits must be >= 0, 0 choosing automatically (got %d)", p.num_splits);
  if (p.cu_seqlens_q != nullptr) {
    FMHA_REQUIRE(p.total_q >= 0, "total_q must be >= 0 (got %d)", p.total_q);
    FMHA_REQUIRE(p.seqlen_new == 0,
                 "appending new tokens (seqlen_new = %d) cannot be combined with packed queries (cu_seqlens_q): "
                 "write the new keys and values into the cache first",
                 p.seqlen_new);
    FMHA_REQUIRE(p.rotary_dim == 0, "rotary embedding (rotary_dim = %d) cannot be combined with packed queries "
                 "(cu_seqlens_q): rotate q before the call", p.rotary_dim);
  } else {
    FMHA_REQUIRE(p.total_q == 0, "total_q (%d) is for packed queries and needs cu_seqlens_q", p.total_q);
  }
  check_tensor(p.q, "q", work);
  check_tensor(p.out, "out", work);
  check_tensor(p.k_cache, "k_cache", work);
  check_tensor(p.v_cache, "v_cache", work);
  check_tensor(p.k_new, "k_new", p.batch > 0 && p.seqlen_new > 0);
  check_tensor(p.v_new, "v_new", p.batch > 0 && p.seqlen_new > 0);
}

void validate_host_metadata(const fmha_decode_params& p) {
  const int64_t capacity = p.block_table ? (int64_t)p.max_pages * p.cache_seqlen : p.cache_seqlen;
  if (p.cu_seqlens_q != nullptr) {
    const int32_t* cu = p.cu_seqlens_q;
    FMHA_REQUIRE(cu[0] >= 0, "cu_seqlens_q[0] must be >= 0 (got %d)", cu[0]);
    for (int32_t b = 0; b < p.batch; ++b) {
      const int64_t len = (int64_t)cu[b + 1] - cu[b];
      FMHA_REQUIRE(len >= 0, "cu_seqlens_q must be non-decreasing, but cu_seqlens_q[%d] = %d > cu_seqlens_q[%d] = %d",
                   b, cu[b], b + 1, cu[b + 1]);
      FMHA_REQUIRE(len <= p.seqlen_q, "sequence %d has %lld query rows in cu_seqlens_q, more than max_seqlen_q = %d", b,
                   (long long)len, p.seqlen_q);
    }
    FMHA_REQUIRE(cu[p.batch] <= p.total_q, "cu_seqlens_q[%d] = %d exceeds the %d rows of q", p.batch, cu[p.batch],
                 p.total_q);
  }
  for (int32_t b = 0; b < p.batch; ++b) {
    const int64_t filled = p.cache_seqlens[b], end = filled + p.seqlen_new;
    FMHA_REQUIRE(filled >= 0, "cache_seqlens[%d] = %lld must be >= 0", b, (long long)filled);
    FMHA_REQUIRE(end <= capacity,
                 "cache_seqlens[%d] + %d new tokens = %lld exceeds the cache capacity of %lld positions", b,
                 p.seqlen_new, (long long)end, (long long)capacity);
    if (p.cache_leftpad)
      FMHA_REQUIRE(p.cache_leftpad[b] >= 0 && p.cache_leftpad[b] <= filled,
                   "cache_leftpad[%d] = %d is outside [0, cache_seqlens[%d] = %lld]", b, p.cache_leftpad[b], b,
                   (long long)filled);
    if (p.cache_batch_idx)
      FMHA_REQUIRE(p.cache_batch_idx[b] >= 0 && p.cache_batch_idx[b] < p.cache_batch,
                   "cache_batch_idx[%d] = %d is outside [0, %d)", b, p.cache_batch_idx[b], p.cache_batch);
    else if (!p.block_table)
      FMHA_REQUIRE(b < p.cache_batch, "batch entry %d has no cache: the cache holds %d sequences", b, p.cache_batch);
    if (p.block_table) {
      const int64_t pages = (end + p.cache_seqlen - 1) / p.cache_seqlen;
      for (int64_t i = 0; i < pages; ++i) {
        const int32_t page = p.block_table[(int64_t)b * p.block_table_stride + i];
        FMHA_REQUIRE(page >= 0 && page < p.cache_batch, "block_table[%d][%lld] = %d is outside [0, %d) pages", b,
                     (long long)i, page, p.cache_batch);
      }
    }
    if (p.rotary_dim != 0) {
      const int64_t last = filled + std::max(p.seqlen_q, p.seqlen_new) - 1;
      FMHA_REQUIRE(last < p.seqlen_ro, "rotary_cos/sin have %d positions, sequence %d needs position %lld",
                   p.seqlen_ro, b, (long long)last);
    }
  }
}

void validate_host_metadata(const fmha_problem& p) {
  if (p.cu_seqlens_q != nullptr) {
    const char* names[2] = {"cu_seqlens_q", "cu_seqlens_k"};
    const int32_t* cus[2] = {p.cu_seqlens_q, p.cu_seqlens_k};
    const int32_t totals[2] = {p.total_q, p.total_k};
    const int32_t maxes[2] = {p.seqlen_q, p.seqlen_k};
    const char* max_names[2] = {"max_seqlen_q", "max_seqlen_k"};
    for (int t = 0; t < 2; ++t) {
      const int32_t* cu = cus[t];
      FMHA_REQUIRE(cu[0] >= 0, "%s[0] must be >= 0 (got %d)", names[t], cu[0]);
      for (int32_t b = 0; b < p.batch; ++b) {
        const int64_t len = (int64_t)cu[b + 1] - cu[b];
        FMHA_REQUIRE(len >= 0, "%s must be non-decreasing, but %s[%d] = %d > %s[%d] = %d", names[t],
                     names[t], b, cu[b], names[t], b + 1, cu[b + 1]);
        FMHA_REQUIRE(len <= maxes[t], "sequence %d has %lld rows in %s, more than %s = %d", b,
                     (long long)len, names[t], max_names[t], maxes[t]);
      }
      FMHA_REQUIRE(cu[p.batch] <= totals[t], "%s[%d] = %d exceeds the %d rows of %s", names[t], p.batch,
                   cu[p.batch], totals[t], t == 0 ? "q" : "k and v");
    }
  }
  if (p.seqused_k != nullptr) {
    for (int32_t b = 0; b < p.batch; ++b) {
      const int32_t cap = p.cu_seqlens_k != nullptr ? p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b] : p.seqlen_k;
      FMHA_REQUIRE(p.seqused_k[b] >= 0 && p.seqused_k[b] <= cap,
                   "seqused_k[%d] = %d is outside [0, %d], the keys sequence %d has", b, p.seqused_k[b],
                   cap, b);
    }
  }
}

}  // namespace fmha
