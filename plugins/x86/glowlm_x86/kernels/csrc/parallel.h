// Dynamic work sharing for the kernels whose work splits into many equal chunks.
//
// at::parallel_for hands each thread one fixed slice, so a step waits for the
// slowest thread; on a shared or oversubscribed machine (another process on one
// of the cores) that thread may be descheduled for milliseconds and stall every
// layer. Here threads take chunks one at a time from a shared counter, so a busy
// core simply does fewer chunks. Uses the OpenMP runtime torch already loaded,
// with torch's thread count.
#pragma once

#include <ATen/Parallel.h>
#include <omp.h>

#include <cstdint>

namespace glowlm {

// Calls fn(chunk) for every chunk in [0, n), spread over torch's threads.
template <typename F>
void parallel_chunks(int64_t n, const F& fn) {
  const int threads = at::get_num_threads();
  if (threads <= 1 || n <= 1 || omp_in_parallel()) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t i = 0; i < n; ++i) fn(i);
}

}  // namespace glowlm
