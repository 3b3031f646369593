// A minimal parallel-for for the CPU backend: work items are independent, each writes
// disjoint outputs, so results never depend on the number of threads.
#pragma once

#include <stdint.h>

#include <functional>

namespace fmha {
namespace cpu {

// Threads to use: FMHA_NUM_THREADS if set (>= 1), else the hardware concurrency.
int num_threads();

// Calls fn(i) for i in [0, n) on up to num_threads() threads; rethrows the first exception.
void parallel_for(int64_t n, const std::function<void(int64_t)>& fn);

}  // namespace cpu
}  // namespace fmha
