# The CUDA backend, included by the top-level CMakeLists.txt when nvcc is found.
enable_language(CUDA)
find_package(CUDAToolkit REQUIRED)

# Machine code for each listed architecture (e.g. 80;86;89;90;120).  90 is built as sm_90a,
# Hopper's arch-specific target: the same mma.sync kernels, plus the wgmma/TMA forward
# (fwd_sm90_kernel.h), whose body exists only there (sm_90a code runs on compute
# capability 9.0 alone, which is every GPU that 90 targets).
set(_fmha_cuda_arch_list "")
set(_fmha_sm90a OFF)
foreach(arch IN LISTS FMHA_CUDA_ARCHS)
  if(arch STREQUAL "90" OR arch STREQUAL "90a")
    list(APPEND _fmha_cuda_arch_list "90a-real")
    set(_fmha_sm90a ON)
  else()
    list(APPEND _fmha_cuda_arch_list "${arch}-real")
  endif()
endforeach()
string(REPLACE ";" "," _fmha_cuda_arch_names "${FMHA_CUDA_ARCHS}")

target_sources(fmha PRIVATE ${FMHA_CUDA_SOURCES})
set_target_properties(fmha PROPERTIES
  CUDA_ARCHITECTURES "${_fmha_cuda_arch_list}"
  CUDA_STANDARD 17
  CUDA_STANDARD_REQUIRED ON
  CUDA_RUNTIME_LIBRARY Static)
target_compile_definitions(fmha PRIVATE FMHA_WITH_CUDA "FMHA_CUDA_ARCH_LIST=\"${_fmha_cuda_arch_names}\"")
if(_fmha_sm90a)
  target_compile_definitions(fmha PRIVATE FMHA_WITH_SM90A)
endif()
if(FMHA_SMALL_SMEM_BWD_EVERYWHERE)
  target_compile_definitions(fmha PRIVATE FMHA_SMALL_SMEM_BWD_EVERYWHERE)
endif()
# --use_fast_math: ex2/tanh approximations and flush-to-zero, as the kernels intend.
target_compile_options(fmha PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--use_fast_math -Xptxas=-warn-spills>)
# Static cudart: libfmha loads on a machine with only the driver and our wheel.
target_link_libraries(fmha PRIVATE CUDA::cudart_static)
