// Blocked GEMM for prefill and batched decode (torch-free): y = x w^T (+ bias), weights in their
// stored dtype (fp32, bf16, fp16) and layout ([N, K]), fp32 math.
//
// Why not torch's GEMM: on CPUs without native bf16 math torch's bf16 GEMM runs at a
// fraction of the fp32 rate, and even its fp32 GEMM reached only ~65 % of the FMA peak
// on the llama-1b shapes here. This is a register-blocked kernel in the classic
// layout, measured at ~75-85 % of peak on Zen 3 (docs/performance.md):
//
//   x is packed once per call, transposed into panels of P = 2W token rows: xp[k][P];
//   threads take work items of kNB weight rows x kMC tokens (dynamic, see parallel.h);
//   for each K block of kKC:
//     the block's weights are converted to fp32 into a thread buffer (kNB x kKC, L2);
//     for each token panel:            its kKC x P slice stays in L1
//       for each kGemmNR weight rows:  kGemmNR x P outputs in registers: per k, two
//                                      vector loads of x, one broadcast per weight row
//
// Outputs accumulate transposed in a thread tile (weight row, token) across K blocks
// and are written to y (plus bias) once per work item. Each weight element is
// converted once per kMC tokens; the conversion costs ~10 % against fp32 weights.
// Long batches (P2's 4096-token prefill) are cut into kMC-token chunks so that one K
// block of a chunk's panels (kMC x kKC floats, 256 KiB) stays in L2 across the weight
// blocks and the thread tile stays small; one pass over all tokens read them from
// DRAM for every weight block (llama-1b shapes, M = 4096: 112-129 -> 136-156 GFLOP/s).
#pragma once

#include <algorithm>
#include <type_traits>
#include <vector>

#include "cpu/parallel.h"
#include "cpu/vec.h"

namespace glowlm::cpu {

using namespace glowlm::vec;

constexpr int64_t kP = 2 * W;              // token rows per panel (two vectors)
constexpr int64_t kKC = 256;               // K block
constexpr int64_t kNB = 8 * kGemmNR;       // weight rows per work item
constexpr int64_t kMC = 256;               // token rows per work item
static_assert(kMC % kP == 0, "token chunks hold whole panels");
constexpr int64_t kFewPanels = 2;          // up to this many panels: few_panels()

// ct[n, 0:V*W] (+)= sum_k wf[n, k] * xp[k, 0:V*W] for NR weight rows (wf rows ldw apart).
template <int NR, int V>
inline void tile(const float* xp, const float* wf, int64_t ldw, int64_t kc, float* ct,
                 int64_t ldc, bool accumulate) {
  VecF acc[NR][V];
  GLOWLM_UNROLL for (int n = 0; n < NR; ++n) {
    GLOWLM_UNROLL for (int v = 0; v < V; ++v) acc[n][v] = zero();
  }
#pragma GCC unroll 4
  for (int64_t k = 0; k < kc; ++k) {
    VecF a[V];
    GLOWLM_UNROLL for (int v = 0; v < V; ++v) a[v] = load(xp + k * kP + v * W);
    GLOWLM_UNROLL for (int n = 0; n < NR; ++n) {
      const VecF b = broadcast(wf + n * ldw + k);
      GLOWLM_UNROLL for (int v = 0; v < V; ++v) acc[n][v] = fmadd(a[v], b, acc[n][v]);
    }
  }
  GLOWLM_UNROLL for (int n = 0; n < NR; ++n) {
    GLOWLM_UNROLL for (int v = 0; v < V; ++v) {
      float* out = ct + n * ldc + v * W;
      VecF r = acc[n][v];
      if (accumulate) r = add(r, load(out));
      store(out, r);
    }
  }
}

// Rows [0, rows) of a weight block against one panel of V vectors: full register tiles,
// then single rows (N not a multiple of kGemmNR).
template <int V>
inline void panel(const float* xp, const float* wf, int64_t ldw, int64_t rows, int64_t kc,
                  float* ct, int64_t ldc, bool accumulate) {
  int64_t n = 0;
  for (; n + kGemmNR <= rows; n += kGemmNR)
    tile<kGemmNR, V>(xp, wf + n * ldw, ldw, kc, ct + n * ldc, ldc, accumulate);
  for (; n < rows; ++n) tile<1, V>(xp, wf + n * ldw, ldw, kc, ct + n * ldc, ldc, accumulate);
}

// Rows [0, rows) of a weight block against `panels` token panels (x: the first panel's
// K block; panels are K * kP floats apart); the last needs one vector if last_half.
inline void panels_of(const float* x, int64_t K, const float* wf, int64_t ldw, int64_t rows,
                      int64_t kc, int64_t panels, bool last_half, float* ct, int64_t ldc,
                      bool accumulate) {
  for (int64_t p = 0; p < panels; ++p) {
    if (p == panels - 1 && last_half) {
      panel<1>(x + p * K * kP, wf, ldw, rows, kc, ct + p * kP, ldc, accumulate);
    } else {
      panel<2>(x + p * K * kP, wf, ldw, rows, kc, ct + p * kP, ldc, accumulate);
    }
  }
}

// xp[p][k][P] = x[p * P + i][k] (zero past M).
template <typename XT>
void pack_activations(const XT* x, int64_t M, int64_t K, float* xp) {
  constexpr int64_t kChunk = 256;
  const int64_t panels = (M + kP - 1) / kP, kchunks = (K + kChunk - 1) / kChunk;
  parallel_chunks(panels * kchunks, [&](int64_t c) {
    const int64_t p = c / kchunks, k0 = c % kchunks * kChunk, k1 = std::min(K, k0 + kChunk);
    float* dst = xp + p * K * kP;
    for (int64_t i = 0; i < kP; ++i) {
      const int64_t m = p * kP + i;
      if (m < M) {
        for (int64_t k = k0; k < k1; ++k) dst[k * kP + i] = to_float(x[m * K + k]);
      } else {
        for (int64_t k = k0; k < k1; ++k) dst[k * kP + i] = 0.0f;
      }
    }
  });
}

// Prefetches bytes [0, bytes) of rows [0, rows) of w (row stride ldw elements).
template <typename WT>
inline void prefetch_rows(const WT* w, int64_t ldw, int64_t rows, int64_t bytes) {
  for (int64_t r = 0; r < rows; ++r) prefetch_range(w + r * ldw, bytes);
}

// fp32 copy of weight rows [0, rows), columns [0, kc) (row stride ldw) into out[rows][kc].
// Each row's next K block (next_kc columns) is prefetched on the way: the hardware
// prefetchers do not follow 48 short row segments, and without this the next block's
// conversion waited on DRAM (measured round-robin in one process, llama-1b shapes,
// bf16, 2 threads: M = 32 111 -> 129 GFLOP/s, M = 128 144 -> 156). A work item's
// first block is prefetched whole before its conversion (gemm_impl), so its rows'
// misses overlap instead of coming one row at a time (M = 32: +5-9 %).
template <typename WT>
inline void convert_block(const WT* w, int64_t ldw, int64_t rows, int64_t kc, float* out,
                          int64_t next_kc) {
  for (int64_t r = 0; r < rows; ++r) {
    const WT* src = w + r * ldw;
    float* dst = out + r * kc;
    prefetch_range(src + kc, next_kc * static_cast<int64_t>(sizeof(WT)));
    int64_t k = 0;
    for (; k + W <= kc; k += W) store(dst + k, load(src + k));
    for (; k < kc; ++k) dst[k] = to_float(src[k]);
  }
}

// One K block of a work item with few token panels (batched decode): each kGemmNR-row
// group is converted just before its tiles run, into a small buffer that stays in L1.
// Converting the whole block first wrote kNB x kKC floats (48 KiB) that left L1 before
// the tiles read them, and the conversion's stores missed L1.
template <typename WT>
inline void few_panels(const float* xpp, int64_t K, const WT* w, int64_t rows, int64_t kc,
                       int64_t next_kc, int64_t panels, bool last_half, float* ct,
                       int64_t ldc, bool accumulate, float* sub) {
  for (int64_t n = 0; n < rows; n += kGemmNR) {
    const int64_t nr = std::min<int64_t>(kGemmNR, rows - n);
    convert_block(w + n * K, K, nr, kc, sub, next_kc);
    panels_of(xpp, K, sub, kc, nr, kc, panels, last_half, ct + n * ldc, ldc, accumulate);
  }
}

template <typename WT, typename OT>
void gemm_impl(const float* xp, int64_t M, int64_t K, const WT* w, const float* bias, OT* y,
               int64_t N) {
  const int64_t blocks = (N + kNB - 1) / kNB;
  const int64_t chunks = (M + kMC - 1) / kMC;
  // Work items run chunk-major, so both threads share one token chunk's panels in cache.
  parallel_chunks(chunks * blocks, [&](int64_t item) {
    const int64_t m0 = item / blocks * kMC, b = item % blocks;
    const int64_t mc = std::min(kMC, M - m0);
    const int64_t panels = (mc + kP - 1) / kP, p0 = m0 / kP;
    const int64_t ldc = panels * kP;
    const bool last_half = mc - (panels - 1) * kP <= W;  // the last panel needs one vector
    thread_local std::vector<float> wbuf, ctile;
    ctile.resize(kNB * ldc);
    const int64_t n0 = b * kNB, rows = std::min(N - n0, kNB);
    for (int64_t k0 = 0; k0 < K; k0 += kKC) {
      const int64_t kc = std::min(kKC, K - k0);
      const float* wf;
      int64_t ldw;
      if constexpr (std::is_same_v<WT, float>) {
        wf = w + n0 * K + k0;  // fp32 weights are used in place
        ldw = K;
      } else {
        const int64_t next_kc = std::min(kKC, K - k0 - kc);
        if (k0 == 0) prefetch_rows(w + n0 * K, K, rows, kc * static_cast<int64_t>(sizeof(WT)));
        if (panels <= kFewPanels) {
          wbuf.resize(kGemmNR * kKC);
          few_panels(xp + p0 * K * kP + k0 * kP, K, w + n0 * K + k0, rows, kc, next_kc, panels,
                     last_half, ctile.data(), ldc, k0 > 0, wbuf.data());
          continue;
        }
        wbuf.resize(kNB * kKC);
        convert_block(w + n0 * K + k0, K, rows, kc, wbuf.data(), next_kc);
        wf = wbuf.data();
        ldw = kc;
      }
      panels_of(xp + p0 * K * kP + k0 * kP, K, wf, ldw, rows, kc, panels, last_half,
                ctile.data(), ldc, k0 > 0);
    }
    for (int64_t m = 0; m < mc; ++m) {
      OT* out = y + (m0 + m) * N + n0;
      for (int64_t n = 0; n < rows; ++n)
        out[n] = from_float<OT>(ctile[n * ldc + m] + (bias ? bias[n0 + n] : 0.0f));
    }
  });
}

// Floats of the packed activations for M token rows of K (pack_activations' xp).
inline int64_t packed_size(int64_t M, int64_t K) { return (M + kP - 1) / kP * K * kP; }

// y = x w^T (+ bias) for K > 0: x [M, K] in XT, w [N, K] in WT, bias fp32 [N] or null,
// y [M, N] in OT; xp: packed_size(M, K) floats of scratch.
template <typename XT, typename WT, typename OT>
void gemm(const XT* x, int64_t M, int64_t K, const WT* w, const float* bias, OT* y, int64_t N,
          float* xp) {
  pack_activations(x, M, K, xp);
  gemm_impl(xp, M, K, w, bias, y, N);
}

}  // namespace glowlm::cpu
