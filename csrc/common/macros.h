// Host/device qualifiers shared by every backend: the same header compiles with g++/clang
// for the CPU backend, nvcc for CUDA and hipcc/clang for HIP.
#pragma once

#if defined(__CUDACC__) || defined(__HIPCC__) || defined(__HIP__)
#  define FMHA_HOST_DEVICE __host__ __device__ __forceinline__
#  define FMHA_DEVICE __device__ __forceinline__
#else
#  define FMHA_HOST_DEVICE inline
#  define FMHA_DEVICE inline
#endif

#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
#  define FMHA_DEVICE_CODE 1
#else
#  define FMHA_DEVICE_CODE 0
#endif
