// The entry points each backend implements.  api.cpp validates the params, then calls the
// backend of params.device; a backend may assume validated params.
#pragma once

#include <stddef.h>

#include "fmha/fmha.h"

namespace fmha {

namespace cpu {
void fwd(const fmha_fwd_params& p);
size_t bwd_workspace_size(const fmha_bwd_params& p);
void bwd(const fmha_bwd_params& p);
void decode(const fmha_decode_params& p);
void capabilities(fmha_capabilities* caps);
}  // namespace cpu

#if defined(FMHA_WITH_CUDA)
namespace cuda {
size_t fwd_workspace_size(const fmha_fwd_params& p);
void fwd(const fmha_fwd_params& p, void* stream);
size_t bwd_workspace_size(const fmha_bwd_params& p);
void bwd(const fmha_bwd_params& p, void* stream);
size_t decode_workspace_size(const fmha_decode_params& p);
void decode(const fmha_decode_params& p, void* stream);
void capabilities(fmha_capabilities* caps);
}  // namespace cuda
#endif

#if defined(FMHA_WITH_HIP)
namespace hip {
void fwd(const fmha_fwd_params& p, void* stream);
size_t bwd_workspace_size(const fmha_bwd_params& p);
void bwd(const fmha_bwd_params& p, void* stream);
size_t decode_workspace_size(const fmha_decode_params& p);
void decode(const fmha_decode_params& p, void* stream);
void capabilities(fmha_capabilities* caps);
}  // namespace hip
#endif

}  // namespace fmha
