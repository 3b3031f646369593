# The CUDA backend, included by the top-level CMakeLists.txt when nvcc is found.
enable_language(CUDA)
find_package(CUDAToolkit REQUIRED)

# Machine code for each listed architecture (e.g. 80;86;89;90;120); plain sm_90 runs the
# mma.sync kernels on Hopper.
set(_fmha_cuda_arch_list "")
foreach(arch IN LISTS FMHA_CUDA_ARCHS)
  list(APPEND _fmha_cuda_arch_list "${arch}-real")
endforeach()
string(REPLACE ";" "," _fmha_cuda_arch_names "${FMHA_CUDA_ARCHS}")

target_sources(fmha PRIVATE ${FMHA_CUDA_SOURCES})
set_target_properties(fmha PROPERTIES
  CUDA_ARCHITECTURES "${_fmha_cuda_arch_list}"
  CUDA_STANDARD 17
  CUDA_STANDARD_REQUIRED ON
  CUDA_RUNTIME_LIBRARY Static)
target_compile_definitions(fmha PRIVATE FMHA_WITH_CUDA "FMHA_CUDA_ARCH_LIST=\"${_fmha_cuda_arch_names}\"")
if(FMHA_SMALL_SMEM_BWD_EVERYWHERE)
  target_compile_definitions(fmha PRIVATE FMHA_SMALL_SMEM_BWD_EVERYWHERE)
endif()
# --use_fast_math: ex2/tanh approximations and flush-to-zero, as the kernels intend.
target_compile_options(fmha PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--use_fast_math -Xptxas=-warn-spills>)
# Static cudart: libfmha loads on a machine with only the driver and our wheel.
target_link_libraries(fmha PRIVATE CUDA::cudart_static)
