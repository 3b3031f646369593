// The C entry points: read the caller's params, validate, dispatch on the device, and turn
// any exception into a status code plus fmha_last_error().
#include <cstring>
#include <new>

#include "backend.h"
#include "error.h"
#include "validate.h"

namespace fmha {
namespace {

#define FMHA_STR2(x) #x
#define FMHA_STR(x) FMHA_STR2(x)

[[noreturn]] void not_built(fmha_device d) {
  const char* name = d == FMHA_DEVICE_CUDA ? "CUDA" : "HIP";
  FMHA_UNSUPPORTED(
      "this libfmha was built without %s kernels (rebuild on a machine with the %s compiler, "
      "or pass CPU tensors)",
      name, d == FMHA_DEVICE_CUDA ? "nvcc" : "ROCm clang");
}

template <class F>
fmha_status guarded(F&& f) {
  try {
    f();
    set_last_error("");
    return FMHA_SUCCESS;
  } catch (const Error& e) {
    set_last_error(e.what());
    return e.status();
  } catch (const std::bad_alloc&) {
    set_last_error("out of host memory");
    return FMHA_ERROR_INTERNAL;
  } catch (const std::exception& e) {
    set_last_error(std::string("internal error: ") + e.what());
    return FMHA_ERROR_INTERNAL;
  } catch (...) {
    set_last_error("internal error: unknown exception");
    return FMHA_ERROR_INTERNAL;
  }
}

template <class Params>
void init_defaults(Params* p) {
  if (p == nullptr) return;
  std::memset(p, 0, sizeof(*p));
  p->struct_size = sizeof(*p);
  p->device = FMHA_DEVICE_CPU;
  p->problem.dtype = FMHA_DTYPE_FLOAT16;
  p->problem.window_left = -1;
  p->problem.window_right = -1;
  p->problem.mask_align = FMHA_ALIGN_BOTTOM_RIGHT;
}

size_t bwd_workspace_bytes(const fmha_bwd_params& p) {
  switch (p.device) {
    case FMHA_DEVICE_CPU: return cpu::bwd_workspace_size(p);
#if defined(FMHA_WITH_CUDA)
    case FMHA_DEVICE_CUDA: return cuda::bwd_workspace_size(p);
#endif
#if defined(FMHA_WITH_HIP)
    case FMHA_DEVICE_HIP: return hip::bwd_workspace_size(p);
#endif
    default: not_built(p.device);
  }
}

size_t decode_workspace_bytes(const fmha_decode_params& p) {
  switch (p.device) {
    case FMHA_DEVICE_CPU: return 0;
#if defined(FMHA_WITH_CUDA)
    case FMHA_DEVICE_CUDA: return cuda::decode_workspace_size(p);
#endif
#if defined(FMHA_WITH_HIP)
    case FMHA_DEVICE_HIP: return hip::decode_workspace_size(p);
#endif
    default: not_built(p.device);
  }
}

}  // namespace
}  // namespace fmha

using namespace fmha;

extern "C" {

FMHA_API void fmha_fwd_params_init(fmha_fwd_params* p) { init_defaults(p); }

FMHA_API void fmha_bwd_params_init(fmha_bwd_params* p) { init_defaults(p); }

FMHA_API void fmha_decode_params_init(fmha_decode_params* p) {
  if (p == nullptr) return;
  std::memset(p, 0, sizeof(*p));
  p->struct_size = sizeof(*p);
  p->device = FMHA_DEVICE_CPU;
  p->dtype = p->cache_dtype = FMHA_DTYPE_FLOAT16;
  p->window_left = p->window_right = -1;
  p->rotary_interleaved = 1;
}

FMHA_API fmha_status fmha_fwd_workspace_size(const fmha_fwd_params* params, size_t* bytes) {
  return guarded([&] {
    FMHA_REQUIRE(bytes != nullptr, "fmha_fwd_workspace_size: bytes is NULL");
    const fmha_fwd_params p = read_params(params);
    validate(p);
    *bytes = 0;
#if defined(FMHA_WITH_CUDA)
    if (p.device == FMHA_DEVICE_CUDA) *bytes = cuda::fwd_workspace_size(p);
#endif
  });
}

FMHA_API fmha_status fmha_fwd(const fmha_fwd_params* params, void* stream) {
  return guarded([&] {
    const fmha_fwd_params p = read_params(params);
    validate(p);
    switch (p.device) {
      case FMHA_DEVICE_CPU:
        validate_host_metadata(p.problem);
        cpu::fwd(p);
        break;
#if defined(FMHA_WITH_CUDA)
      case FMHA_DEVICE_CUDA: cuda::fwd(p, stream); break;
#endif
#if defined(FMHA_WITH_HIP)
      case FMHA_DEVICE_HIP: hip::fwd(p, stream); break;
#endif
      default: not_built(p.device);
    }
    (void)stream;
  });
}

FMHA_API fmha_status fmha_bwd_workspace_size(const fmha_bwd_params* params, size_t* bytes) {
  return guarded([&] {
    FMHA_REQUIRE(bytes != nullptr, "fmha_bwd_workspace_size: bytes is NULL");
    const fmha_bwd_params p = read_params(params);
    validate(p);
    *bytes = bwd_workspace_bytes(p);
  });
}

FMHA_API fmha_status fmha_bwd(const fmha_bwd_params* params, void* stream) {
  return guarded([&] {
    const fmha_bwd_params p = read_params(params);
    validate(p);
    const size_t need = bwd_workspace_bytes(p);
    FMHA_REQUIRE(need == 0 || (p.workspace != nullptr && p.workspace_size >= need),
                 "workspace of %zu bytes at %p is too small: fmha_bwd_workspace_size() asks for %zu",
                 p.workspace_size, p.workspace, need);
    switch (p.device) {
      case FMHA_DEVICE_CPU:
        validate_host_metadata(p.problem);
        cpu::bwd(p);
        break;
#if defined(FMHA_WITH_CUDA)
      case FMHA_DEVICE_CUDA: cuda::bwd(p, stream); break;
#endif
#if defined(FMHA_WITH_HIP)
      case FMHA_DEVICE_HIP: hip::bwd(p, stream); break;
#endif
      default: not_built(p.device);
    }
    (void)stream;
  });
}

FMHA_API fmha_status fmha_decode_workspace_size(const fmha_decode_params* params, size_t* bytes) {
  return guarded([&] {
    FMHA_REQUIRE(bytes != nullptr, "fmha_decode_workspace_size: bytes is NULL");
    const fmha_decode_params p = read_params(params);
    validate(p);
    *bytes = decode_workspace_bytes(p);
  });
}

FMHA_API fmha_status fmha_decode(const fmha_decode_params* params, void* stream) {
  return guarded([&] {
    const fmha_decode_params p = read_params(params);
    validate(p);
    const size_t need = decode_workspace_bytes(p);
    FMHA_REQUIRE(need == 0 || (p.workspace != nullptr && p.workspace_size >= need),
                 "workspace of %zu bytes at %p is too small: fmha_decode_workspace_size() asks for %zu",
                 p.workspace_size, p.workspace, need);
    switch (p.device) {
      case FMHA_DEVICE_CPU:
        validate_host_metadata(p);
        cpu::decode(p);
        break;
#if defined(FMHA_WITH_CUDA)
      case FMHA_DEVICE_CUDA: cuda::decode(p, stream); break;
#endif
#if defined(FMHA_WITH_HIP)
      case FMHA_DEVICE_HIP: hip::decode(p, stream); break;
#endif
      default: not_built(p.device);
    }
    (void)stream;
  });
}

FMHA_API fmha_status fmha_get_capabilities(fmha_device device, fmha_capabilities* caps) {
  return guarded([&] {
    FMHA_REQUIRE(caps != nullptr, "fmha_get_capabilities: caps is NULL");
    FMHA_REQUIRE(caps->struct_size == sizeof(fmha_capabilities),
                 "fmha_capabilities.struct_size is %u, expected %u", caps->struct_size,
                 (unsigned)sizeof(fmha_capabilities));
    std::memset(caps, 0, sizeof(*caps));
    caps->struct_size = sizeof(*caps);
    FMHA_REQUIRE(device == FMHA_DEVICE_CPU || device == FMHA_DEVICE_CUDA || device == FMHA_DEVICE_HIP,
                 "device %d is not one of FMHA_DEVICE_CPU, _CUDA, _HIP", (int)device);
    if (device == FMHA_DEVICE_CPU) cpu::capabilities(caps);
#if defined(FMHA_WITH_CUDA)
    if (device == FMHA_DEVICE_CUDA) cuda::capabilities(caps);
#endif
#if defined(FMHA_WITH_HIP)
    if (device == FMHA_DEVICE_HIP) hip::capabilities(caps);
#endif
  });
}

FMHA_API const char* fmha_version(void) {
  return FMHA_STR(FMHA_VERSION_MAJOR) "." FMHA_STR(FMHA_VERSION_MINOR) "." FMHA_STR(FMHA_VERSION_PATCH);
}

}  // extern "C"
