// Weight-streaming GEMV for decode (torch-free) (a few token rows); larger M runs gemm.cpp.
//
// Decode is bound by memory bandwidth: every weight byte must be read once per
// step and no more. Each weight row is multiplied with every token row while it is in
// L1, fp32 accumulate, by one of two inner loops (the "Op" of gemv_tile):
//   gemv_f32   x in fp32, weights (fp32, bf16, fp16) converted to fp32 in registers and
//              FMA'd: every CPU, every dtype;
//   gemv_bf16  bf16 x and bf16 weights where the vector header has the pairwise bf16 dot
//              product (GLOWLM_VEC_BF16DOT: vdpbf16ps, Arm BFDOT): both read as stored
//              pairs straight into dot2, no conversion, half the instructions per weight
//              byte. The engine's bf16 decode takes it on AVX512_BF16 CPUs.
// Output rows are split across threads in chunks (64 long or 128 short rows), so each
// thread streams its own slice of the weight; both loops walk the rows the same way.
//
// How rows are walked: each thread's chunk of rows is read as a few sequential
// streams far apart, one row of each at a time, so every load of x serves them all.
// One stream per thread kept too few cache lines in flight: its conversion and FMAs per
// line are enough to hide little of the DRAM latency. Long rows (>= 4 KiB) go four at a
// time from the four quarters of a chunk (four adjacent rows interleaved, the previous
// walk, reached ~92 % of a plain read on the llama-1b matrices; four quarters 100 %).
// Short rows (opt-125m: 768 bf16 = 1.5 KiB) go two at a time from the two halves of a
// chunk (one stream: ~89 %; two halves: 99-100 %; adjacent short rows interleaved are
// much slower, ~17 GB/s, the hardware prefetchers ramping up on every 1.5 KiB row). A
// short-row stream also prefetches kPrefetchBytes ahead in software: the hardware
// prefetchers stop at every 4 KiB page boundary and the rows are too short for them to
// ramp up again (+12-15 %; further ahead was slower; on long rows prefetching made
// them slower, so they do not; the few leftover rows of a chunk, run one at a time,
// do). Figures: C++ microbenchmarks, the models' matrices in
// 2 MiB pages, configurations round-robin in one process (docs/performance.md).
#pragma once

#include <algorithm>
#include <type_traits>

#include "cpu/parallel.h"
#include "cpu/vec.h"

namespace glowlm::cpu {

using namespace glowlm::vec;

constexpr int kNR = 4;                 // weight rows per register tile (long rows)
constexpr int64_t kChunkRows = 64;        // long rows per thread work item: 4 streams
constexpr int64_t kShortChunkRows = 128;  // short rows per work item: 2 streams
constexpr int64_t kShortRowBytes = 4096;
constexpr int64_t kPrefetchBytes = 1024;
constexpr int64_t kLine = 64;

// dst[i] = float(src[i]) for n elements (decode-sized: plain loops, one thread).
template <typename T>
void to_float_buf(const T* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = to_float(src[i]);
}

template <typename T>
void from_float_buf(const float* src, T* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = from_float<T>(src[i]);
}

// y[m, n] += bias[n] for M rows of N, the bias in its own dtype.
template <typename T>
void add_bias(float* y, const T* bias, int64_t M, int64_t N) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) y[m * N + n] += to_float(bias[n]);
}

// How a tile multiplies one step of k. F32Op: x in fp32, each weight vector converted
// to fp32 in registers (vec::load), one FMA per W weights. BF16DotOp (vector headers
// with GLOWLM_VEC_BF16DOT, x and w both bf16): 2W bf16 of a weight row and of x read as
// W pairs as stored, one dot2 per 2W weights, no conversion (see gemv_bf16).
template <typename WT>
struct F32Op {
  using XT = float;
  using V = VecF;
  static constexpr int64_t kStep = W;  // k per vector
  static constexpr bool kPrefetchLongTokenTile = false;  // see gemv_bf16
  static V wload(const WT* p) { return load(p); }
  static V xload(const float* p) { return load(p); }
  static VecF madd(VecF acc, V wv, V xv) { return fmadd(xv, wv, acc); }
};

#if defined(GLOWLM_VEC_BF16DOT)
struct BF16DotOp {
  using XT = bf16;
  using V = VecBF;
  static constexpr int64_t kStep = 2 * W;
  static constexpr bool kPrefetchLongTokenTile = true;  // see gemv_bf16
  static V wload(const bf16* p) { return load_pairs(p); }
  static V xload(const bf16* p) { return load_pairs(p); }
  static VecF madd(VecF acc, V wv, V xv) { return dot2(acc, wv, xv); }
};
#endif

// y[m, n] = sum_k x[m, k] * w[n, k] for MR token rows and NR weight rows, with U
// independent accumulators along k (for ILP when MR x NR is small). Weight row n
// starts at w + n * ws and its outputs at y + n * ys (ws = K, ys = 1 for adjacent rows).
// PF: prefetch each weight row's stream kPrefetchBytes ahead (short rows). The k tail
// (K not a multiple of the step) is scalar: exact products summed in fp32.
template <typename Op, int MR, int NR, int U, bool PF, typename WT>
inline void gemv_tile(const typename Op::XT* x, int64_t K, const WT* w, int64_t ws, float* y,
                      int64_t ys, int64_t ldy) {
  constexpr int64_t S = Op::kStep;
  VecF acc[MR][NR][U];
  GLOWLM_UNROLL for (int m = 0; m < MR; ++m) {
    GLOWLM_UNROLL for (int n = 0; n < NR; ++n) {
      GLOWLM_UNROLL for (int u = 0; u < U; ++u) acc[m][n][u] = zero();
    }
  }
  int64_t k = 0;
  for (; k + U * S <= K; k += U * S) {
    if constexpr (PF) {
      constexpr int64_t bytes = U * S * static_cast<int64_t>(sizeof(WT));
      GLOWLM_UNROLL for (int n = 0; n < NR; ++n) {
        const char* ahead = reinterpret_cast<const char*>(w + n * ws + k) + kPrefetchBytes;
        GLOWLM_UNROLL for (int64_t b = 0; b < bytes; b += kLine) prefetch(ahead + b);
      }
    }
    GLOWLM_UNROLL for (int u = 0; u < U; ++u) {
      typename Op::V wv[NR];
      GLOWLM_UNROLL for (int n = 0; n < NR; ++n) wv[n] = Op::wload(w + n * ws + k + u * S);
      GLOWLM_UNROLL for (int m = 0; m < MR; ++m) {
        const typename Op::V xv = Op::xload(x + m * K + k + u * S);
        GLOWLM_UNROLL for (int n = 0; n < NR; ++n)
          acc[m][n][u] = Op::madd(acc[m][n][u], wv[n], xv);
      }
    }
  }
  for (; k + S <= K; k += S) {
    GLOWLM_UNROLL for (int m = 0; m < MR; ++m) {
      const typename Op::V xv = Op::xload(x + m * K + k);
      GLOWLM_UNROLL for (int n = 0; n < NR; ++n)
        acc[m][n][0] = Op::madd(acc[m][n][0], Op::wload(w + n * ws + k), xv);
    }
  }
  for (int m = 0; m < MR; ++m) {
    for (int n = 0; n < NR; ++n) {
      VecF t = acc[m][n][0];
      for (int u = 1; u < U; ++u) t = add(t, acc[m][n][u]);
      float s = reduce_add(t);
      for (int64_t kk = k; kk < K; ++kk) s += to_float(x[m * K + kk]) * to_float(w[n * ws + kk]);
      y[m * ldy + n * ys] = s;
    }
  }
}

// NR weight rows (ws apart, outputs ys apart) against all M token rows, kGemvMR at a
// time. Only the first pass over the rows prefetches (PF; PFM for a first pass with
// kGemvMR token rows); later token rows find them in L1/L2.
template <typename Op, int NR, int U, bool PF, bool PFM = PF, typename WT>
inline void gemv_rows(const typename Op::XT* x, int64_t M, int64_t K, const WT* w, int64_t ws,
                      float* y, int64_t ys, int64_t N) {
  constexpr int MR = kGemvMR;
  constexpr int U1 = U == 1 ? 1 : 4;  // one token row: more accumulators for ILP
  int64_t m = 0;
  for (; m + MR <= M; m += MR) {
    if (m == 0) gemv_tile<Op, MR, NR, U, PFM>(x, K, w, ws, y, ys, N);
    else gemv_tile<Op, MR, NR, U, false>(x + m * K, K, w, ws, y + m * N, ys, N);
  }
  for (; m < M; ++m) {
    if (m == 0) gemv_tile<Op, 1, NR, U1, PF>(x, K, w, ws, y, ys, N);
    else gemv_tile<Op, 1, NR, U1, false>(x + m * K, K, w, ws, y + m * N, ys, N);
  }
}

// The row walk of both paths: y[M, N] = x w^T, N rows of K weights in chunks over the
// threads, each chunk read as a few distant streams (the header comment).
template <typename Op, typename WT>
void gemv_walk(const typename Op::XT* x, int64_t M, int64_t K, const WT* w, float* y, int64_t N) {
  const bool short_rows = K * static_cast<int64_t>(sizeof(WT)) < kShortRowBytes;
  const int64_t rows = short_rows ? kShortChunkRows : kChunkRows;
  const int64_t chunks = (N + rows - 1) / rows;
  parallel_chunks(chunks, [&](int64_t c) {
    const int64_t begin = c * rows, end = std::min(N, begin + rows);
    int64_t n = begin;
    if (short_rows) {  // rows begin + i and begin + half + i together
      const int64_t half = (end - begin) / 2;
      for (; n < begin + half; ++n)
        gemv_rows<Op, 2, 2, true>(x, M, K, w + n * K, half * K, y + n, half, N);
      n = begin + 2 * half;
    } else {  // rows begin + i + j * quarter, j < kNR, together
      const int64_t quarter = (end - begin) / kNR;
      for (; n < begin + quarter; ++n)
        gemv_rows<Op, kNR, 1, false, Op::kPrefetchLongTokenTile>(x, M, K, w + n * K,
                                                                 quarter * K, y + n, quarter, N);
      n = begin + kNR * quarter;
    }
    for (; n < end; ++n) gemv_rows<Op, 1, 2, true>(x, M, K, w + n * K, K, y + n, 1, N);
  });
}

// fp32 activations, weights in any storage dtype converted in registers.
template <typename WT>
void gemv_f32(const float* x, int64_t M, int64_t K, const WT* w, float* y, int64_t N) {
  gemv_walk<F32Op<WT>>(x, M, K, w, y, N);
}

#if defined(GLOWLM_VEC_BF16DOT)
// bf16 activations and bf16 weights with the pairwise bf16 dot product (vdpbf16ps on
// AVX512_BF16, BFDOT on Arm FEAT_BF16): weights and x go to dot2 as stored pairs, fp32
// accumulation. A product of two bf16 is exact in fp32 (8 x 8 significant bits), so the
// result is gemv_f32's on the same inputs up to the order (and, on Arm, the rounding
// mode) of the fp32 additions. Against gemv_f32 it does per 64 weight bytes one load and
// one dot2 per token row instead of two converting loads and two FMAs.
//
// Why it is faster although decode is bound by memory: the fewer instructions per cache
// line, the more lines the out-of-order window keeps in flight. On the Zen 5 host of
// issue 17 (2 vCPUs, bench_gemv.cpp, llama-1b decode matrices, three runs, medians):
// with the memory slow (read 38-46 GB/s) one token row streams at the read rate on
// either path (91-102 %); with it fast (58-68 GB/s) this path stays at 80-98 % of the
// read and the fp32 path falls to 76-88 %. Four token rows (four dot2 or, on the fp32
// path, eight FMAs per line) reach 71-78 % against 50-59 % with a fast memory. With one
// thread, where one core carries the whole read, M = 1 ran at 94 % against 84 %.
// Tried on this loop and not kept (2048 x 8192 at M = 4, 21 repetitions round-robin,
// read 45.5 GB/s, this walk 92 %): eight streams per chunk (87 %), two 4-row passes
// over the rows with 2-token tiles (91 %), two streams (73-75 %); with a fast memory two
// accumulator sets (59 % against 71 %). So it keeps gemv_f32's walk and tile sizes,
// with one change: with a fast memory four token rows on long rows were bound by the
// core (68-74 % of the read), and prefetching each long-row stream kPrefetchBytes ahead
// in the first 4-token pass took them to 76-83 % (others' CPU 1 %; 512 B gained less,
// 2 KiB about the same; level with a slow memory). At one token row the same prefetch
// was level or slower (90-98 % against 93-107 %), so single-row tiles do without.
inline void gemv_bf16(const bf16* x, int64_t M, int64_t K, const bf16* w, float* y, int64_t N) {
  gemv_walk<BF16DotOp>(x, M, K, w, y, N);
}
#endif

// The decode GEMV from storage dtypes: y[M, N] (fp32) = x[M, K] w[N, K]^T. bf16 x and
// bf16 w take gemv_bf16 where the vector header has the pairwise dot product; anything
// else converts x to fp32 once into xbuf (M * K floats) and runs gemv_f32.
template <typename XT, typename WT>
void gemv(const XT* x, int64_t M, int64_t K, const WT* w, float* y, int64_t N, float* xbuf) {
#if defined(GLOWLM_VEC_BF16DOT)
  if constexpr (std::is_same_v<XT, bf16> && std::is_same_v<WT, bf16>) {
    gemv_bf16(x, M, K, w, y, N);
    return;
  }
#endif
  to_float_buf(x, xbuf, M * K);
  gemv_f32(xbuf, M, K, w, y, N);
}

}  // namespace glowlm::cpu
