// bf16 GEMM on a pair-packed weight for a few to a few dozen token rows (torch-free),
// where the vector header has the pairwise bf16 dot product (GLOWLM_VEC_BF16DOT:
// vdpbf16ps on AVX512_BF16, BFDOT on Arm FEAT_BF16).
//
// Why: a server at concurrency 4-16 runs every linear at that many token rows. There the
// weight read (each byte once per step) and the dot products (M per weight) are about
// equal costs, and neither of the other kernels pays only the larger of the two: the
// row-major GEMV (gemv.h) reduces W lanes horizontally per output and re-reads its
// weights for every 4 token rows, and oneDNN's blocked GEMM reached 28 GB/s at 8 rows
// on 16384 x 2048 (2.38 ms, Zen 4 guest, 2 threads) where a plain read of the weight
// takes 1.3 ms.
//
// Layout (pack_pairs): wp[N / W][K / 2][W][2]: block b holds weight rows bW .. bW + W - 1
// and, per pair of k, one VecBF whose lane r is row bW + r's (w[k], w[k + 1]). One load
// feeds dot2 for every token row against that row's (x[k], x[k + 1]) broadcast to every
// lane, and each fp32 accumulator lane is one output: no horizontal sums, and a block
// is one contiguous stream (K * W * 2 bytes) the hardware prefetchers follow. Rows past
// N are zero. The products of two bf16 are exact in fp32, so the result is gemv_bf16's
// up to the order of the fp32 additions.
//
// Walk: threads take work items of kPairItemBlocks blocks (dynamic, parallel.h); an item
// goes over K in chunks of kPairKC k (the item's weights of one chunk stay in L1 while
// every token tile runs over them, fp32 partial sums in an item buffer between chunks),
// token tiles of 8 rows x 2 blocks (16 accumulators) or 4 / 2 / 1 rows x 4 blocks.
#pragma once

#include <algorithm>
#include <cstring>
#include <vector>

#include "cpu/parallel.h"
#include "cpu/vec.h"

namespace glowlm::cpu {

using namespace glowlm::vec;

#if defined(GLOWLM_VEC_BF16DOT)

constexpr int64_t kPairItemBlocks = 4;  // blocks (W weight rows each) per work item
constexpr int64_t kPairKC = 128;        // k per chunk: 4 blocks x 128 x W x 2 B = 16 KiB

// Elements of one packed block: K / 2 pairs of W lanes of 2.
inline int64_t pair_block_elems(int64_t K) { return K * W; }

// wp = w[N, K] (row-major) in the layout above, ceil(N / W) blocks; K must be even.
inline void pack_pairs(const bf16* w, int64_t N, int64_t K, bf16* wp) {
  const int64_t blocks = (N + W - 1) / W;
  parallel_chunks(blocks, [&](int64_t b) {
    bf16* out = wp + b * pair_block_elems(K);
    for (int64_t kp = 0; kp < K / 2; ++kp) {
      for (int64_t r = 0; r < W; ++r) {
        const int64_t n = b * W + r;
        bf16* dst = out + (kp * W + r) * 2;
        if (n < N) {
          dst[0] = w[n * K + 2 * kp];
          dst[1] = w[n * K + 2 * kp + 1];
        } else {
          std::memset(dst, 0, 2 * sizeof(bf16));
        }
      }
    }
  });
}

// acc (+)= x[MT rows, k0:k1] . block pairs, for NB blocks; the partial sums of each
// (token row, block) live in part[m * ldp + i * W] between chunks.
template <int MT, int NB, bool PF>
inline void pairs_tile(const bf16* x, int64_t ldx, const bf16* wp, int64_t block_elems,
                       int64_t k0, int64_t k1, float* part, int64_t ldp, bool first) {
  VecF acc[MT][NB];
  GLOWLM_UNROLL for (int m = 0; m < MT; ++m) {
    GLOWLM_UNROLL for (int i = 0; i < NB; ++i)
      acc[m][i] = first ? zero() : load(part + m * ldp + i * W);
  }
  for (int64_t k = k0; k < k1; k += 2) {
    VecBF wv[NB];
    GLOWLM_UNROLL for (int i = 0; i < NB; ++i) {
      if constexpr (PF) __builtin_prefetch(wp + i * block_elems + (k + kPairKC) * W, 0, 2);
      wv[i] = load_pairs(wp + i * block_elems + k * W);
    }
    GLOWLM_UNROLL for (int m = 0; m < MT; ++m) {
      const VecBF xv = broadcast_pair(x + m * ldx + k);
      GLOWLM_UNROLL for (int i = 0; i < NB; ++i) acc[m][i] = dot2(acc[m][i], wv[i], xv);
    }
  }
  GLOWLM_UNROLL for (int m = 0; m < MT; ++m) {
    GLOWLM_UNROLL for (int i = 0; i < NB; ++i) store(part + m * ldp + i * W, acc[m][i]);
  }
}

// Every token row against nb (<= kPairItemBlocks) blocks, one K chunk: tiles of 4, 2,
// 1 token rows x 4 blocks (16, 8, 4 accumulators). The first tile reads the chunk from
// memory and prefetches the next one (the later tiles find theirs in L1).
inline void pairs_chunk(const bf16* x, int64_t M, int64_t K, const bf16* wp, int64_t nb,
                        int64_t k0, int64_t k1, float* part, bool first) {
  const int64_t be = pair_block_elems(K), ldp = kPairItemBlocks * W;
  int64_t m = 0;
  auto rows = [&](auto mt, auto pf) {
    constexpr int MT = decltype(mt)::value;
    constexpr bool PF = decltype(pf)::value;
    int64_t i = 0;
    for (; i + 4 <= nb; i += 4)
      pairs_tile<MT, 4, PF>(x + m * K, K, wp + i * be, be, k0, k1, part + m * ldp + i * W,
                            ldp, first);
    for (; i < nb; ++i)
      pairs_tile<MT, 1, PF>(x + m * K, K, wp + i * be, be, k0, k1, part + m * ldp + i * W,
                            ldp, first);
  };
  auto tile = [&](auto mt) {
    if (m == 0) rows(mt, std::true_type{});
    else rows(mt, std::false_type{});
  };
  for (; m + 4 <= M; m += 4) tile(std::integral_constant<int, 4>{});
  for (; m + 2 <= M; m += 2) tile(std::integral_constant<int, 2>{});
  for (; m < M; ++m) tile(std::integral_constant<int, 1>{});
}

// y[M, N] = x[M, K] w^T (+ bias) on the packed weight; out(m, n0, vals, count) writes
// `count` fp32 results of row m from column n0 (the caller converts and adds the bias).
template <typename Out>
void gemm_pairs(const bf16* x, int64_t M, int64_t K, const bf16* wp, int64_t N, const Out& out) {
  const int64_t blocks = (N + W - 1) / W;
  const int64_t items = (blocks + kPairItemBlocks - 1) / kPairItemBlocks;
  parallel_chunks(items, [&](int64_t it) {
    const int64_t b0 = it * kPairItemBlocks;
    const int64_t nb = std::min(kPairItemBlocks, blocks - b0);
    thread_local std::vector<float> part;
    part.resize(static_cast<size_t>(M * kPairItemBlocks * W));
    const bf16* w = wp + b0 * pair_block_elems(K);
    for (int64_t k0 = 0; k0 < K; k0 += kPairKC)
      pairs_chunk(x, M, K, w, nb, k0, std::min(K, k0 + kPairKC), part.data(), k0 == 0);
    const int64_t n0 = b0 * W, count = std::min(N, (b0 + nb) * W) - n0;
    for (int64_t m = 0; m < M; ++m)
      out(m, n0, part.data() + m * kPairItemBlocks * W, count);
  });
}

#endif  // GLOWLM_VEC_BF16DOT

}  // namespace glowlm::cpu
