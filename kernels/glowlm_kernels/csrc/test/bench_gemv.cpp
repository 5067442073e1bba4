// Decode GEMV against the read bandwidth of the same matrices, in one process (torch-free).
//
// Why: the decode GEMV is bound by memory bandwidth, so its figure of merit is the share
// of a plain read it reaches, and on a VM the read bandwidth moves by 20-40 % between
// minutes (docs/performance.md). So this measures both on the same matrices, round-robin
// in one process: for each llama-1b decode shape (N x K) and weight dtype it allocates
// enough copies of the matrix to exceed the last-level cache many times (every call
// reads its weights from DRAM, as a decode step does), in 2 MiB pages as the engine
// keeps weights (one mapping advised MADV_HUGEPAGE, core/glowlm/runtime/hugepages.py),
// and per repetition times one pass over all copies of
//   read      a plain read: each thread takes chunks (parallel_chunks, as the GEMV)
//             and sums them with the vector header's loads (AVX-512: 64-byte loads)
//             into kReadAcc independent accumulators, one sequential stream per chunk;
//   f32       cpu::gemv_f32: x converted to fp32 once, weights converted in registers
//             (the old bf16 path; the only fp32 path);
//   bf16dot   cpu::gemv_bf16: bf16 x and weights straight into dot2 (vectors headers
//             with GLOWLM_VEC_BF16DOT: AVX512_BF16, Arm BF16),
//   seq1      the same tile walked as an engine that takes one row at a time does
//             (ggml's decode matmul): 16 adjacent rows per chunk, one sequential
//             stream per thread. On the Zen 4 guest (2026-12-06) it read 95-98 % of
//             the read at M = 1 where bf16dot read 100 %, and 52-80 % at M = 4 where
//             bf16dot read 79-86 %: why gemv_walk reads a chunk as distant streams,
// for M = 1 and 4 token rows. GB/s counts weight bytes (x and y are a few KiB); each
// figure is the median over the repetitions, and "of read" is the GEMV's median over the
// read's median of the same shape.
//
// Built and run by tools/x86/bench_linear.py --native ISA (the variant's flags
// from glowlm_kernels.build); OMP_NUM_THREADS sets the threads (default: all cores).
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "cpu/gemv.h"
#include "test/bench_util.h"  // timing, read bandwidth, 2 MiB-page copies (shared)

namespace {

using namespace glowlm;
using namespace glowlm::vec;
using namespace glowlm::bench;

template <typename WT>
void bench_shape(int64_t N, int64_t K, const char* dtype, int reps, int64_t min_bytes) {
  const int64_t bytes = N * K * static_cast<int64_t>(sizeof(WT));
  std::mt19937 gen(0);
  std::normal_distribution<float> normal(0.0f, 1.0f / std::sqrt(static_cast<float>(K)));
  const Copies mats(bytes, min_bytes, [&](char* p) {
    WT* w = reinterpret_cast<WT*>(p);
    for (int64_t i = 0; i < N * K; ++i) w[i] = from_float<WT>(normal(gen));
  });
  constexpr int64_t kMaxM = 4;
  std::vector<float> xf(kMaxM * K), xbuf(kMaxM * K), y(kMaxM * N);
  std::vector<WT> x(kMaxM * K);
  std::vector<bf16> xb(kMaxM * K);
  std::normal_distribution<float> unit(0.0f, 1.0f);
  for (int64_t i = 0; i < kMaxM * K; ++i) {
    x[i] = from_float<WT>(unit(gen));
    xb[i] = from_float<bf16>(to_float(x[i]));
  }
  std::vector<Config> configs;
  for (int64_t M : {1, 4}) {
    const std::string m = " M=" + std::to_string(M);
    configs.push_back({"f32" + m, [&, M](const char* w) {
      cpu::to_float_buf(x.data(), xbuf.data(), M * K);  // the op converts x once per call
      cpu::gemv_f32(xbuf.data(), M, K, reinterpret_cast<const WT*>(w), y.data(), N);
    }, {}});
#if defined(GLOWLM_VEC_BF16DOT)
    if constexpr (std::is_same_v<WT, bf16>) {
      configs.push_back({"bf16dot" + m, [&, M](const char* w) {
        cpu::gemv_bf16(xb.data(), M, K, reinterpret_cast<const bf16*>(w), y.data(), N);
      }, {}});
      configs.push_back({"seq1" + m, [&, M](const char* w) {
        const bf16* wb = reinterpret_cast<const bf16*>(w);
        const int64_t chunks = (N + 15) / 16;
        parallel_chunks(chunks, [&](int64_t c) {
          const int64_t b = c * 16, e = std::min(N, b + 16);
          for (int64_t n = b; n < e; ++n)
            cpu::gemv_rows<cpu::BF16DotOp, 1, 4, false>(xb.data(), M, K, wb + n * K, K,
                                                         y.data() + n, 1, N);
        });
      }, {}});
    }
#endif
  }
  run_round_robin(dtype, N, K, mats, std::move(configs), reps);
}

}  // namespace

int main(int argc, char** argv) {
  const BenchArgs args = parse_bench_args(
      argc, argv, "--dtypes", "bf16,f32",
      {{2048, 2048}, {512, 2048}, {16384, 2048}, {2048, 8192}, {32000, 2048}});
  for (const auto& [N, K] : args.shapes) {
    if (args.has("bf16")) bench_shape<bf16>(N, K, "bf16", args.reps, args.min_mib << 20);
    if (args.has("f32")) bench_shape<float>(N, K, "f32", args.reps, args.min_mib << 20);
  }
  return 0;
}
