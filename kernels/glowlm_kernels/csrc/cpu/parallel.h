// Threading for the kernels: torch's OpenMP pool in the torch module, plain OpenMP (or
// one thread) in the torch-free test driver.
//
// Dynamic work sharing (parallel_chunks) for the kernels whose work splits into many
// equal chunks: a static split (parallel_for) hands each thread one fixed slice, so a
// step waits for the slowest thread; on a shared or oversubscribed machine (another
// process on one of the cores) that thread may be descheduled for milliseconds and
// stall every layer. In parallel_chunks threads take chunks one at a time from a
// shared counter, so a busy core simply does fewer chunks.
#pragma once

#include <algorithm>
#include <cstdint>

#if defined(_OPENMP)
#include <omp.h>
#endif
#if defined(GLOWLM_TORCH)
#include <ATen/Parallel.h>
#endif

namespace glowlm {

// The thread count: torch's (GLOWLM_TORCH builds; at::get_num_threads also starts
// torch's lazy OpenMP set-up), else OpenMP's, else one.
inline int num_threads() {
#if defined(GLOWLM_TORCH)
  return at::get_num_threads();
#elif defined(_OPENMP)
  return omp_get_max_threads();
#else
  return 1;
#endif
}

inline bool in_parallel() {
#if defined(_OPENMP)
  return omp_in_parallel();
#else
  return true;
#endif
}

// Calls fn(chunk) for every chunk in [0, n), spread over the threads.
template <typename F>
void parallel_chunks(int64_t n, const F& fn) {
  const int threads = num_threads();
  if (threads <= 1 || n <= 1 || in_parallel()) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
#if defined(_OPENMP)
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t i = 0; i < n; ++i) fn(i);
#endif
}

// fn(b, e) over contiguous slices of [begin, end) of at least `grain` items, one slice
// per thread (at::parallel_for's split).
template <typename F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& fn) {
  const int64_t n = end - begin;
  if (n <= 0) return;
  const int threads = num_threads();
  if (threads <= 1 || n <= grain || in_parallel()) {
    fn(begin, end);
    return;
  }
#if defined(_OPENMP)
  const int64_t tasks = std::min<int64_t>(threads, (n + grain - 1) / std::max<int64_t>(grain, 1));
  const int64_t chunk = (n + tasks - 1) / tasks;
#pragma omp parallel num_threads(static_cast<int>(tasks))
  {
    const int64_t b = begin + omp_get_thread_num() * chunk;
    const int64_t e = std::min(end, b + chunk);
    if (b < e) fn(b, e);
  }
#endif
}

}  // namespace glowlm
