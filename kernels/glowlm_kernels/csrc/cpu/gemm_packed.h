// GEMM on a block-packed weight for a few to a few dozen token rows (torch-free): bf16
// weights where the vector header has the pairwise bf16 dot product (GLOWLM_VEC_BF16DOT:
// vdpbf16ps on AVX512_BF16, BFDOT on Arm FEAT_BF16), fp32 weights on every ISA.
//
// Why: a server at concurrency 4-16 runs every linear at that many token rows. There the
// weight read (each byte once per step) and the multiply-adds (M per weight) are about
// equal costs, and neither of the other kernels pays only the larger of the two: the
// row-major GEMV (gemv.h) reduces W lanes horizontally per output and re-reads its
// weights for every 4 token rows, and oneDNN's blocked GEMM reached 28 GB/s at 8 rows
// on 16384 x 2048 bf16 (2.38 ms, Zen 4 guest, 2 threads) where a plain read of the
// weight takes 1.3 ms.
//
// Layout (pack_blocks): wp[N / W][K / S][W][S], S = the k per multiply (2 for bf16
// pairs, 1 for fp32): block b holds weight rows bW .. bW + W - 1 and, per step of k, one
// vector whose lane r is row bW + r's S weights. One load feeds the multiply-add of every
// token row against that row's x (the bf16 pair, or the float, broadcast to every lane),
// and each fp32 accumulator lane is one output: no horizontal sums, and a block is one
// contiguous stream (K * W elements) the hardware prefetchers follow. Rows past N are
// zero. Products of two bf16 are exact in fp32, so the bf16 result is gemv_bf16's up to
// the order of the fp32 additions; the fp32 one is the fp32 GEMV's up to that order.
//
// Walk: threads take work items of kPackedItemBlocks blocks (dynamic, parallel.h); an
// item goes over K in chunks (Op::kKC k: 16 KiB of the item's weights, in L1 while every
// token tile runs over them, fp32 partial sums in an item buffer between chunks), token
// tiles of 4 / 2 / 1 rows x 4 blocks (16 / 8 / 4 accumulators). The first tile of a chunk
// streams it from memory and prefetches the next chunk into L2 (into L1, or with 32 KiB
// chunks, the bf16 kernel lost to oneDNN at 8 rows, probably because the next chunk
// evicted the current one before the second tile read it).
#pragma once

#include <algorithm>
#include <cstring>
#include <vector>

#include "cpu/parallel.h"
#include "cpu/vec.h"

namespace glowlm::cpu {

using namespace glowlm::vec;

constexpr int64_t kPackedItemBlocks = 4;  // blocks (W weight rows each) per work item

// How a packed tile multiplies, per weight dtype: S k per vector, the chunk length, the
// weight load, the broadcast of x and the multiply-add.
template <typename T>
struct PackedOp;

template <>
struct PackedOp<float> {
  using V = VecF;
  static constexpr int64_t S = 1;
  static constexpr int64_t kKC = 64;  // 4 blocks x 64 x W x 4 B = 16 KiB on AVX-512
  static V w(const float* p) { return load(p); }
  static V x(const float* p) { return broadcast(p); }
  static VecF madd(VecF acc, V wv, V xv) { return fmadd(xv, wv, acc); }
};

#if defined(GLOWLM_VEC_BF16DOT)
template <>
struct PackedOp<bf16> {
  using V = VecBF;
  static constexpr int64_t S = 2;
  static constexpr int64_t kKC = 128;  // 4 blocks x 128 x W x 2 B = 16 KiB on AVX-512
  static V w(const bf16* p) { return load_pairs(p); }
  static V x(const bf16* p) { return broadcast_pair(p); }
  static VecF madd(VecF acc, V wv, V xv) { return dot2(acc, wv, xv); }
};
#endif

// Elements of one packed block.
inline int64_t packed_block_elems(int64_t K) { return K * W; }

// wp = w[N, K] (row-major) in the layout above, ceil(N / W) blocks; K a multiple of S.
// Tiles of kPackSteps steps of k: a tile's output (kPackSteps * W * S elements, 4 KiB)
// stays in L1 while each row's run of the tile is read in order. Walking k in the outer
// loop and the W rows in the inner one instead reads W lines K * sizeof(T) apart, which
// share one L1 set for K = 2048 (4 KiB apart) and missed on every load: 16384 x 2048 bf16
// packed at ~2 GB/s.
constexpr int64_t kPackSteps = 64;

template <typename T>
void pack_blocks(const T* w, int64_t N, int64_t K, T* wp) {
  constexpr int64_t S = PackedOp<T>::S;
  const int64_t blocks = (N + W - 1) / W, steps = K / S;
  parallel_chunks(blocks, [&](int64_t b) {
    T* out = wp + b * packed_block_elems(K);
    for (int64_t s0 = 0; s0 < steps; s0 += kPackSteps) {
      const int64_t s1 = std::min(steps, s0 + kPackSteps);
      for (int64_t r = 0; r < W; ++r) {
        const int64_t n = b * W + r;
        if (n < N) {
          const T* src = w + n * K;
          for (int64_t ks = s0; ks < s1; ++ks)
            std::memcpy(out + (ks * W + r) * S, src + ks * S, S * sizeof(T));
        } else {
          for (int64_t ks = s0; ks < s1; ++ks)
            std::memset(static_cast<void*>(out + (ks * W + r) * S), 0, S * sizeof(T));
        }
      }
    }
  });
}

// acc (+)= x[MT rows, k0:k1] . packed weights, for NB blocks; the partial sums of each
// (token row, block) live in part[m * ldp + i * W] between chunks. PF: prefetch the next
// chunk (the first tile of a chunk).
template <typename T, int MT, int NB, bool PF>
inline void packed_tile(const T* x, int64_t ldx, const T* wp, int64_t block_elems, int64_t k0,
                        int64_t k1, float* part, int64_t ldp, bool first) {
  using Op = PackedOp<T>;
  VecF acc[MT][NB];
  GLOWLM_UNROLL for (int m = 0; m < MT; ++m) {
    GLOWLM_UNROLL for (int i = 0; i < NB; ++i)
      acc[m][i] = first ? zero() : load(part + m * ldp + i * W);
  }
  for (int64_t k = k0; k < k1; k += Op::S) {
    typename Op::V wv[NB];
    GLOWLM_UNROLL for (int i = 0; i < NB; ++i) {
      if constexpr (PF) __builtin_prefetch(wp + i * block_elems + (k + Op::kKC) * W, 0, 2);
      wv[i] = Op::w(wp + i * block_elems + k * W);
    }
    GLOWLM_UNROLL for (int m = 0; m < MT; ++m) {
      const typename Op::V xv = Op::x(x + m * ldx + k);
      GLOWLM_UNROLL for (int i = 0; i < NB; ++i) acc[m][i] = Op::madd(acc[m][i], wv[i], xv);
    }
  }
  GLOWLM_UNROLL for (int m = 0; m < MT; ++m) {
    GLOWLM_UNROLL for (int i = 0; i < NB; ++i) store(part + m * ldp + i * W, acc[m][i]);
  }
}

// Every token row against nb (<= kPackedItemBlocks) blocks, one K chunk: tiles of 4, 2,
// 1 token rows x 4 blocks. The first tile reads the chunk from memory and prefetches the
// next one (the later tiles find theirs in L1).
template <typename T>
void packed_chunk(const T* x, int64_t M, int64_t K, const T* wp, int64_t nb, int64_t k0,
                  int64_t k1, float* part, bool first) {
  const int64_t be = packed_block_elems(K), ldp = kPackedItemBlocks * W;
  int64_t m = 0;
  auto rows = [&](auto mt, auto pf) {
    constexpr int MT = decltype(mt)::value;
    constexpr bool PF = decltype(pf)::value;
    int64_t i = 0;
    for (; i + 4 <= nb; i += 4)
      packed_tile<T, MT, 4, PF>(x + m * K, K, wp + i * be, be, k0, k1, part + m * ldp + i * W,
                                ldp, first);
    for (; i < nb; ++i)
      packed_tile<T, MT, 1, PF>(x + m * K, K, wp + i * be, be, k0, k1, part + m * ldp + i * W,
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

// y[M, N] = x[M, K] w^T on the packed weight; out(m, n0, vals, count) writes `count` fp32
// results of row m from column n0 (the caller converts and adds the bias).
template <typename T, typename Out>
void gemm_packed(const T* x, int64_t M, int64_t K, const T* wp, int64_t N, const Out& out) {
  constexpr int64_t KC = PackedOp<T>::kKC;
  const int64_t blocks = (N + W - 1) / W;
  const int64_t items = (blocks + kPackedItemBlocks - 1) / kPackedItemBlocks;
  parallel_chunks(items, [&](int64_t it) {
    const int64_t b0 = it * kPackedItemBlocks;
    const int64_t nb = std::min(kPackedItemBlocks, blocks - b0);
    thread_local std::vector<float> part;
    part.resize(static_cast<size_t>(M * kPackedItemBlocks * W));
    const T* w = wp + b0 * packed_block_elems(K);
    for (int64_t k0 = 0; k0 < K; k0 += KC)
      packed_chunk(x, M, K, w, nb, k0, std::min(K, k0 + KC), part.data(), k0 == 0);
    const int64_t n0 = b0 * W, count = std::min(N, (b0 + nb) * W) - n0;
    for (int64_t m = 0; m < M; ++m)
      out(m, n0, part.data() + m * kPackedItemBlocks * W, count);
  });
}

}  // namespace glowlm::cpu
