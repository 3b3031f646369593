#include "tma.h"

#include <cuda_runtime.h>

#include <mutex>

namespace fmha {
namespace cuda {

namespace {

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

EncodeTiled encode_fn() {
  static EncodeTiled fn = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult status{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &status) ==
            cudaSuccess &&
        status == cudaDriverEntryPointSuccess)
      fn = reinterpret_cast<EncodeTiled>(p);
  });
  return fn;
}

}  // namespace

bool encode_tensor_map(CUtensorMap* map, const void* data, fmha_dtype dtype, int64_t cols, int64_t rows,
                       int64_t heads, int64_t batches, int64_t row_stride, int64_t head_stride,
                       int64_t batch_stride, int box_cols, int box_rows) {
  const EncodeTiled fn = encode_fn();
  if (fn == nullptr || cols <= 0 || rows <= 0 || heads <= 0 || batches <= 0) return false;
  // The stride of a dimension of size 1 is never used (its coordinate is 0) and may be
  // anything a framework left there; it gets a valid one.
  const int es = dtype == FMHA_DTYPE_FLOAT8_E4M3 ? 1 : 2;  // bytes per element
  const int64_t sizes[3] = {rows, heads, batches};
  int64_t strides[3] = {row_stride, head_stride, batch_stride};
  for (int i = 0; i < 3; ++i) {
    if (sizes[i] == 1) strides[i] = 16 / es;  // 16 bytes: the least the copy engine takes
    if (strides[i] <= 0) return false;  // the map's strides are unsigned: such layouts take the other path
  }
  const cuuint64_t dims[4] = {(cuuint64_t)cols, (cuuint64_t)rows, (cuuint64_t)heads, (cuuint64_t)batches};
  const cuuint64_t byte_strides[3] = {(cuuint64_t)strides[0] * es, (cuuint64_t)strides[1] * es,
                                      (cuuint64_t)strides[2] * es};
  const cuuint32_t box[4] = {(cuuint32_t)box_cols, (cuuint32_t)box_rows, 1, 1};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  const CUtensorMapDataType type = dtype == FMHA_DTYPE_FLOAT8_E4M3 ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                                   : dtype == FMHA_DTYPE_BFLOAT16  ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                                   : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  const CUtensorMapSwizzle swizzle = box_cols * es == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B;
  return fn(map, type, 4, const_cast<void*>(data), dims, byte_strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
            swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace cuda
}  // namespace fmha
