/*
 * fmha — fast, memory-efficient, exact attention.  The public C API.
 *
 * This header is the whole surface a C or C++ consumer sees.  It needs no torch and no
 * CUDA/HIP header: device memory is passed as void*, streams as void* (cudaStream_t or
 * hipStream_t), and every entry point returns a status code with a message from
 * fmha_last_error().
 *
 * Conventions
 *  - Tensors are described by fmha_tensor: a pointer plus int64 strides, counted in
 *    elements, for batch, row (sequence position) and head.  The last dimension (head_dim)
 *    is always contiguous.
 *  - Fixed-length layout: q (B, Sq, Hq, D), k and v (B, Sk, Hk, D).  Variable-length
 *    ("varlen") layout: q (total_q, Hq, D), k and v (total_k, Hk, D), with int32
 *    cu_seqlens_q / cu_seqlens_k of B + 1 offsets; batch_stride is then ignored.
 *  - Hq must be a multiple of Hk (multi-query and grouped-query attention): query head h
 *    reads key/value head h / (Hq / Hk).
 *  - Key j is visible to query i iff  i + off - window_left <= j <= i + off + window_right,
 *    off = Sk - Sq (FMHA_ALIGN_BOTTOM_RIGHT, the flash_attn convention) or 0
 *    (FMHA_ALIGN_TOP_LEFT, torch's is_causal); -1 means unbounded; causal is
 *    window_right = 0.  Lengths are per sequence (varlen and seqused_k included).
 *  - Scores are s = scale * q.k; with softcap c > 0, s = c * tanh(s / c); with ALiBi,
 *    s -= slope[b, h] * |i + off - j|.
 *  - A query row that sees no key gets output 0 and LSE -inf; its gradients are 0.
 *  - LSE is the natural-log log-sum-exp of the scores, fp32, (B, Hq, Sq) contiguous for
 *    fixed length and (Hq, total_q) contiguous for varlen.
 *  - Dropout keeps each probability with probability 1 - dropout_p and scales kept values
 *    by 1 / (1 - dropout_p).  Element (b, h, i, j) is kept or dropped by a pure function of
 *    (seed, offset, b, h, i, j) built on Philox4x32-10 (docs/dropout.md), identical on
 *    every backend.
 *  - The library never synchronizes a stream and never allocates device memory: the
 *    backward pass asks for its workspace with fmha_bwd_workspace_size(), the fp8 forward
 *    with fmha_fwd_workspace_size().
 *  - GPU launches go to the calling thread's current device; the stream must belong to it.
 *    Metadata in device memory (cu_seqlens, seqused_k, block tables) is not read on the host: GPU kernels
 *    clamp every length to the tensor bounds they were given instead.  The CPU backend
 *    reads it and rejects inconsistent values.
 */
#ifndef FMHA_FMHA_H_
#define FMHA_FMHA_H_

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#  if defined(FMHA_BUILDING_LIBRARY)
#    define FMHA_API __declspec(dllexport)
#  else
#    define FMHA_API __declspec(dllimport)
#  endif
#else
#  define FMHA_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define FMHA_VERSION_MAJOR 0
#define FMHA_VERSION_MINOR 1
#define FMHA_VERSION_PATCH 0

/* Largest head dimension any backend accepts. */
#define FMHA_MAX_HEAD_DIM 256

typedef enum fmha_status {
  FMHA_SUCCESS = 0,
  FMHA_ERROR_INVALID_VALUE = 1, /* an argument is out of its documented range */
  FMHA_ERROR_NOT_SUPPORTED = 2, /* valid, but this build or device cannot do it */
  FMHA_ERROR_DEVICE = 3,        /* the GPU runtime reported an error (launch, attribute) */
  FMHA_ERROR_INTERNAL = 4       /* a bug in fmha: please report it */
} fmha_status;

typedef enum fmha_dtype {
  FMHA_DTYPE_FLOAT32 = 0,
  FMHA_DTYPE_FLOAT16 = 1,
  FMHA_DTYPE_BFLOAT16 = 2,
  FMHA_DTYPE_FLOAT8_E4M3 = 3, /* KV caches (fmha_decode_params.cache_dtype), and q, k, v of
                               * the fp8 forward (fmha_fwd_params, CUDA sm_90 only) */
  FMHA_DTYPE_INT8 = 4         /* KV caches only */
} fmha_dtype;

/* How a quantized KV cache is scaled back: value = stored * scale. */
typedef enum fmha_cache_scaling {
  FMHA_SCALE_NONE = 0,      /* the cache holds `dtype` values */
  FMHA_SCALE_PER_HEAD = 1,  /* k_scale, v_scale: (Hk) */
  FMHA_SCALE_PER_TOKEN = 2  /* k_scale, v_scale: one per cache row and head, (cache_batch, cache_seqlen, Hk) */
} fmha_cache_scaling;

typedef enum fmha_device {
  FMHA_DEVICE_CPU = 0,
  FMHA_DEVICE_CUDA = 1,
  FMHA_DEVICE_HIP = 2
} fmha_device;

typedef enum fmha_mask_align {
  FMHA_ALIGN_BOTTOM_RIGHT = 0, /* off = Sk - Sq: the last query sees the last key */
  FMHA_ALIGN_TOP_LEFT = 1      /* off = 0: query i sees key i */
} fmha_mask_align;

/* A view of a (batch, row, head, head_dim) tensor; strides in elements. */
typedef struct fmha_tensor {
  void* data;
  int64_t batch_stride; /* ignored in varlen mode */
  int64_t row_stride;
  int64_t head_stride;
} fmha_tensor;

/* The dequantization factors of an fp8 input (fmha_fwd_params.q_descale, ...): element
 * values are stored * data[b * batch_stride + hk * head_stride], hk the KV head (query head
 * h has hk = h / (Hq / Hk), FlashAttention-3's (batch, nheads_k) factors); strides 0 and 0
 * give one factor for the whole tensor, and data NULL means 1. */
typedef struct fmha_descale {
  const float* data;
  int64_t batch_stride;
  int64_t head_stride;
} fmha_descale;

/* What is computed: shapes, masking and score options shared by forward and backward. */
typedef struct fmha_problem {
  fmha_dtype dtype;    /* of q, k, v, out (and dout, dq, dk, dv) */
  int32_t batch;       /* B: sequences in the batch */
  int32_t seqlen_q;    /* fixed length: Sq.  varlen: max_seqlen_q, a bound on every sequence */
  int32_t seqlen_k;    /* fixed length: Sk.  varlen: max_seqlen_k */
  int32_t total_q;     /* varlen only: rows of the packed q (and out) */
  int32_t total_k;     /* varlen only: rows of the packed k and v */
  int32_t num_heads_q; /* Hq */
  int32_t num_heads_k; /* Hk, divides Hq */
  int32_t head_dim;    /* D, 1 .. FMHA_MAX_HEAD_DIM */

  const int32_t* cu_seqlens_q; /* (B + 1) row offsets into q, or NULL for fixed length */
  const int32_t* cu_seqlens_k; /* (B + 1) row offsets into k and v; NULL iff cu_seqlens_q is */
  const int32_t* seqused_k;    /* optional (B): keys actually used by each sequence */

  float scale;           /* multiplies q.k; flash_attn's default is head_dim ** -0.5 */
  float softcap;         /* 0 disables */
  int32_t window_left;   /* -1: unbounded */
  int32_t window_right;  /* -1: unbounded; 0 with window_left -1 is causal */
  fmha_mask_align mask_align;

  const float* alibi_slopes;  /* optional, fp32, (Hq) or (B, Hq) */
  int64_t alibi_batch_stride; /* 0 for (Hq) slopes, else the stride between batches */

  float dropout_p;  /* probability of dropping, [0, 1) */
  uint64_t seed;    /* Philox key */
  uint64_t offset;  /* Philox counter offset */
} fmha_problem;

typedef struct fmha_fwd_params {
  uint32_t struct_size; /* sizeof(fmha_fwd_params) as the caller compiled it */
  fmha_device device;
  fmha_problem problem;

  fmha_tensor q, k, v; /* inputs */
  fmha_tensor out;     /* output, same layout rules as q */
  float* lse;          /* optional output, see the conventions above */

  /* Optional, for tests and debugging (flash_attn's return_attn_probs): the normalized
   * attention probabilities in `problem.dtype`, laid out as (B, Hq, seqlen_q, seqlen_k)
   * through batch/head/row strides, with dropped entries negated.  Rows and columns past a
   * sequence's own lengths are written as 0. */
  fmha_tensor probs;

  /* The fp8 forward (FlashAttention-3's): problem.dtype FMHA_DTYPE_FLOAT8_E4M3 means q, k
   * and v hold e4m3 values and out is bfloat16 (strides in its own elements).  Scores are
   * scale * q_descale * k_descale * q.k and the output is multiplied by v_descale; lse is of
   * those scores.  CUDA on sm_90 only; no dropout, probs or seqused_k; q, k and v 16-byte
   * aligned with strides that are multiples of 16.  The workspace (v transposed for the
   * tensor cores) is fmha_fwd_workspace_size() bytes, 0 for every other dtype. */
  fmha_descale q_descale, k_descale, v_descale;
  void* workspace;
  size_t workspace_size;
} fmha_fwd_params;

typedef struct fmha_bwd_params {
  uint32_t struct_size; /* sizeof(fmha_bwd_params) as the caller compiled it */
  fmha_device device;
  fmha_problem problem; /* as in the forward call being differentiated */

  fmha_tensor q, k, v, out, dout; /* inputs; out is the forward's output */
  const float* lse;               /* the forward's LSE */
  const float* dlse;              /* optional gradient of the LSE (same layout), or NULL */
  fmha_tensor dq, dk, dv;         /* outputs */

  int32_t deterministic; /* nonzero: bitwise reproducible, no atomics */
  void* workspace;       /* device memory of at least fmha_bwd_workspace_size() bytes */
  size_t workspace_size;
} fmha_bwd_params;

/* Attention of a few new queries per sequence against a KV cache (flash_attn_with_kvcache):
 * optionally appends new keys/values to the cache first (in place), applies rotary
 * embeddings, and reads contiguous or paged, plain or quantized caches.  Masks align
 * bottom-right: the last query sees the last key; key j of sequence b is cache position
 * leftpad[b] + j, and the sequence has Sk = cache_seqlens[b] + seqlen_new - leftpad[b] keys. */
typedef struct fmha_decode_params {
  uint32_t struct_size; /* sizeof(fmha_decode_params) as the caller compiled it */
  fmha_device device;

  fmha_dtype dtype; /* of q, out, k_new, v_new and rotary_cos/sin; FLOAT16 or BFLOAT16 (or FLOAT32) */
  int32_t batch, seqlen_q, num_heads_q, num_heads_k, head_dim;
  fmha_tensor q, out; /* (B, Sq, Hq, D) */
  float* lse;         /* optional output (B, Hq, Sq) */

  /* Cache: contiguous (cache_batch, cache_seqlen, Hk, D), or, with a block table, paged
   * (num_pages = cache_batch, page_size = cache_seqlen, Hk, D).  batch_stride steps
   * sequences or pages, row_stride cache positions, head_stride heads. */
  fmha_dtype cache_dtype; /* == dtype, or FMHA_DTYPE_FLOAT8_E4M3 / FMHA_DTYPE_INT8 with scaling */
  fmha_tensor k_cache, v_cache;
  int32_t cache_batch;
  int32_t cache_seqlen;
  const int32_t* block_table;     /* optional (B, max_pages) page indices: paged cache */
  int64_t block_table_stride;     /* between sequences of block_table */
  int32_t max_pages;              /* columns of block_table */
  const int32_t* cache_seqlens;   /* (B): positions already filled (required) */
  const int32_t* cache_batch_idx; /* optional (B): cache sequence of each batch entry (contiguous only) */
  const int32_t* cache_leftpad;   /* optional (B): first valid cache position */

  fmha_cache_scaling scaling; /* FMHA_SCALE_NONE unless cache_dtype is fp8/int8 */
  float* k_scale;             /* see fmha_cache_scaling; per-token scales of new rows are written */
  float* v_scale;

  fmha_tensor k_new, v_new; /* optional (B, seqlen_new, Hk, D), written at cache_seqlens[b] first */
  int32_t seqlen_new;

  /* Rotary embedding (optional): cos and sin (seqlen_ro, rotary_dim / 2), contiguous, in
   * `dtype`; applied to k_new at positions cache_seqlens[b] + t and to q at
   * cache_seqlens[b] + i (or all at cache_seqlens[b] when neither causal nor windowed).
   * Interleaved rotates pairs (2i, 2i + 1); otherwise (i, i + rotary_dim / 2) (GPT-NeoX). */
  const void* rotary_cos;
  const void* rotary_sin;
  int32_t rotary_dim; /* even, <= head_dim; 0 disables */
  int32_t seqlen_ro;
  int32_t rotary_interleaved;

  float scale, softcap;
  int32_t window_left, window_right; /* -1 unbounded; causal is window_right = 0 */
  const float* alibi_slopes;         /* optional (Hq) or (B, Hq) */
  int64_t alibi_batch_stride;

  int32_t num_splits; /* split-KV count; 0 picks one */
  void* workspace;    /* device memory of fmha_decode_workspace_size() bytes */
  size_t workspace_size;

  /* Fields below were appended after the first layout; a caller built against an older
   * fmha.h passes a smaller struct_size and they read as 0 (NULL).
   *
   * Packed queries (FlashAttention-3's cu_seqlens_q; vLLM's paged varlen call): q and out
   * are (total_q, Hq, D) with batch_stride ignored, sequence b owning rows
   * cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1 (Sq_b of them, at most seqlen_q, which is
   * then max_seqlen_q); LSE is (Hq, total_q).  Each sequence's mask aligns bottom-right on
   * its own lengths (off = Sk_b - Sq_b), so one call mixes prefill chunks and decode steps.
   * Needs seqlen_new = 0 and rotary_dim = 0 (no append, no rotary).  Device-resident
   * cu_seqlens_q is clamped to [0, total_q] and each Sq_b to [0, seqlen_q] on the GPU. */
  const int32_t* cu_seqlens_q; /* optional (B + 1) row offsets into q and out */
  int32_t total_q;             /* rows of the packed q and out (with cu_seqlens_q) */
} fmha_decode_params;

/* Feature bits of fmha_capabilities.features. */
#define FMHA_FEATURE_BACKWARD (1u << 0)
#define FMHA_FEATURE_VARLEN (1u << 1)
#define FMHA_FEATURE_GQA (1u << 2)
#define FMHA_FEATURE_WINDOW (1u << 3)
#define FMHA_FEATURE_SOFTCAP (1u << 4)
#define FMHA_FEATURE_ALIBI (1u << 5)
#define FMHA_FEATURE_DROPOUT (1u << 6)
#define FMHA_FEATURE_DETERMINISTIC (1u << 7)
#define FMHA_FEATURE_DECODE (1u << 8) /* fmha_decode, paged and quantized caches */
#define FMHA_FEATURES_TRAINING 0xFFu  /* every bit up to FMHA_FEATURE_DETERMINISTIC */

typedef struct fmha_capabilities {
  uint32_t struct_size; /* set by the caller to sizeof(fmha_capabilities) */
  int32_t available;    /* 1 if this build has the backend, else 0 */
  uint32_t dtypes;      /* bit (1 << fmha_dtype) per accepted dtype */
  int32_t max_head_dim;
  uint32_t features;    /* FMHA_FEATURE_* bits */
  char archs[128];      /* compiled GPU architectures, ';'-separated ("" for the CPU) */
} fmha_capabilities;

/* Fill params with defaults: struct_size, no window (-1, -1), bottom-right alignment,
 * fp16, everything optional NULL or 0.  Sizes, pointers and scale are the caller's. */
FMHA_API void fmha_fwd_params_init(fmha_fwd_params* params);
FMHA_API void fmha_bwd_params_init(fmha_bwd_params* params);
FMHA_API void fmha_decode_params_init(fmha_decode_params* params);

/* Bytes of device workspace fmha_fwd needs for these params (0 unless fp8). */
FMHA_API fmha_status fmha_fwd_workspace_size(const fmha_fwd_params* params, size_t* bytes);

/* out = softmax(scores) . v, and lse.  Asynchronous on GPU streams. */
FMHA_API fmha_status fmha_fwd(const fmha_fwd_params* params, void* stream);

/* Bytes of device workspace fmha_bwd needs for these params (0 is a valid answer). */
FMHA_API fmha_status fmha_bwd_workspace_size(const fmha_bwd_params* params, size_t* bytes);

/* dq, dk, dv from dout and the forward's out and lse.  Asynchronous on GPU streams. */
FMHA_API fmha_status fmha_bwd(const fmha_bwd_params* params, void* stream);

/* Bytes of device workspace fmha_decode needs (split-KV partial results). */
FMHA_API fmha_status fmha_decode_workspace_size(const fmha_decode_params* params, size_t* bytes);

/* out (and lse) for q against the cache, after appending k_new/v_new.  Asynchronous. */
FMHA_API fmha_status fmha_decode(const fmha_decode_params* params, void* stream);

/* What this build offers on a device kind. */
FMHA_API fmha_status fmha_get_capabilities(fmha_device device, fmha_capabilities* caps);

/* The message of the last failed call on this thread ("" if none). */
FMHA_API const char* fmha_last_error(void);

/* "MAJOR.MINOR.PATCH" of the library actually loaded. */
FMHA_API const char* fmha_version(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FMHA_FMHA_H_ */
