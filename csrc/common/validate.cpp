#include "validate.h"

#include <cmath>
#include <cstring>

#include "error.h"

namespace fmha {

namespace {

// Size of the first published layout of each params struct.  A caller compiled against an
// older header passes a smaller struct_size; the fields it lacks read as zero.
constexpr uint32_t kFwdParamsV1 = sizeof(fmha_fwd_params);
constexpr uint32_t kBwdParamsV1 = sizeof(fmha_bwd_params);

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

void check_problem(fmha_device device, const fmha_problem& p) {
  FMHA_REQUIRE(device == FMHA_DEVICE_CPU || device == FMHA_DEVICE_CUDA || device == FMHA_DEVICE_HIP,
               "device %d is not one of FMHA_DEVICE_CPU, _CUDA, _HIP", (int)device);
  FMHA_REQUIRE(p.dtype == FMHA_DTYPE_FLOAT32 || p.dtype == FMHA_DTYPE_FLOAT16 ||
                   p.dtype == FMHA_DTYPE_BFLOAT16,
               "dtype %d is not one of FMHA_DTYPE_FLOAT32, _FLOAT16, _BFLOAT16", (int)p.dtype);
  FMHA_REQUIRE(p.batch >= 0, "batch must be >= 0 (got %d)", p.batch);
  FMHA_REQUIRE(p.seqlen_q >= 0 && p.seqlen_k >= 0, "seqlen_q and seqlen_k must be >= 0 (got %d, %d)",
               p.seqlen_q, p.seqlen_k);
  FMHA_REQUIRE(p.num_heads_q >= 1 && p.num_heads_k >= 1,
               "num_heads_q and num_heads_k must be >= 1 (got %d, %d)", p.num_heads_q, p.num_heads_k);
  FMHA_REQUIRE(p.num_heads_q % p.num_heads_k == 0,
               "num_heads_q (%d) must be a multiple of num_heads_k (%d)", p.num_heads_q, p.num_heads_k);
  FMHA_REQUIRE(p.head_dim >= 1 && p.head_dim <= FMHA_MAX_HEAD_DIM,
               "head_dim must be between 1 and %d (got %d)", FMHA_MAX_HEAD_DIM, p.head_dim);
  const bool varlen = p.cu_seqlens_q != nullptr;
  FMHA_REQUIRE(varlen == (p.cu_seqlens_k != nullptr),
               "cu_seqlens_q and cu_seqlens_k must be given together (varlen) or both be NULL");
  if (varlen) {
    FMHA_REQUIRE(p.total_q >= 0 && p.total_k >= 0, "total_q and total_k must be >= 0 (got %d, %d)",
                 p.total_q, p.total_k);
  }
  FMHA_REQUIRE(std::isfinite(p.scale), "scale must be finite (got %g)", (double)p.scale);
  FMHA_REQUIRE(std::isfinite(p.softcap) && p.softcap >= 0.f,
               "softcap must be finite and >= 0, 0 disabling it (got %g)", (double)p.softcap);
  FMHA_REQUIRE(p.window_left >= -1 && p.window_right >= -1,
               "window_left and window_right must be >= -1, -1 meaning unbounded (got %d, %d)",
               p.window_left, p.window_right);
  FMHA_REQUIRE(p.mask_align == FMHA_ALIGN_BOTTOM_RIGHT || p.mask_align == FMHA_ALIGN_TOP_LEFT,
               "mask_align %d is not FMHA_ALIGN_BOTTOM_RIGHT or FMHA_ALIGN_TOP_LEFT", (int)p.mask_align);
  FMHA_REQUIRE(p.alibi_batch_stride >= 0, "alibi_batch_stride must be >= 0 (got %lld)",
               (long long)p.alibi_batch_stride);
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

void validate(const fmha_fwd_params& p) {
  check_problem(p.device, p.problem);
  const bool work = has_work(p.problem), keys = has_keys(p.problem);
  check_tensor(p.q, "q", work);
  check_tensor(p.k, "k", work && keys);
  check_tensor(p.v, "v", work && keys);
  check_tensor(p.out, "out", work);
  check_tensor(p.probs, "probs", false);
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
