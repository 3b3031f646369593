# The HIP backend, included by the top-level CMakeLists.txt when a ROCm compiler is found
# (check_language(HIP): hipcc/amdclang of a ROCm install, e.g. the rocm/pytorch images).
# CI compiles the same sources device-only with a bare clang instead (tools/hip_report.py,
# .ci/hip_check.sh), so nothing here runs there.
enable_language(HIP)
include(CheckCompilerFlag)

string(REPLACE ";" "," _fmha_hip_arch_names "${FMHA_HIP_ARCHS}")

target_sources(fmha PRIVATE ${FMHA_HIP_SOURCES})
set_target_properties(fmha PROPERTIES
  HIP_ARCHITECTURES "${FMHA_HIP_ARCHS}"
  HIP_STANDARD 17
  HIP_STANDARD_REQUIRED ON)
target_compile_definitions(fmha PRIVATE FMHA_WITH_HIP "FMHA_HIP_ARCH_LIST=\"${_fmha_hip_arch_names}\"")
# Single-instruction log2/exp (v_log_f32, v_exp_f32) instead of the exact device-library
# versions, as the CUDA build's --use_fast_math; clang >= 19 has the flag.  CI compiles with
# it too, so the ISA it checks is the ISA this build makes.
check_compiler_flag(HIP -fgpu-approx-transcendentals FMHA_HIP_APPROX_TRANSCENDENTALS)
if(FMHA_HIP_APPROX_TRANSCENDENTALS)
  target_compile_options(fmha PRIVATE $<$<COMPILE_LANGUAGE:HIP>:-fgpu-approx-transcendentals>)
endif()
# The HIP runtime (libamdhip64) is linked by the HIP language support.  There is no static
# HIP runtime: libfmha needs ROCm's libamdhip64 at run time, which every ROCm install and a
# ROCm build of torch (torch/lib) provide.
