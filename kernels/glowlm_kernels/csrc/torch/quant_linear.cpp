// Quantized linear kernels: weight-only int4/int8 (W4A16, W8A16) and int8 x int8 (W8A8).
//
// Both read weights in a layout prepared once at load (glowlm_x86/quant.py) so that one
// contiguous load feeds one register of 16 output rows:
//
//   weight-only:  [N/16][K/2][16] bytes for 4 bits (low nibble: column k, high: k + 1),
//                 [N/16][K/2][2][16] bytes for 8 bits (16 rows of column k, then k + 1);
//                 unsigned values q with w = scale * (q - zero) per group of columns;
//                 scale and zero * scale as float32 or float16 [N/16][G][16], so the
//                 16 rows a block's work item computes find theirs in one sequential
//                 stream (a [G][N] layout cost a scattered pair of cache lines per
//                 group). Symmetric weights (zero = 2^(bits-1) everywhere: GPTQ/AWQ
//                 without zero points, compressed-tensors symmetric, GGUF Q4_0/Q8_0)
//                 pass no zero * scale tensor at all. Decode reads every byte once per
//                 token, so this is speed: at group 32, float32 scale and zero cost 2
//                 bits per weight, a float16 scale alone 0.5 (the loader picks float16
//                 only where it holds every scale and zero * scale exactly).
//   W8A8:         [N/16][K/4][16][4] int8: four consecutive columns of each of 16 rows,
//                 the operand layout of vpdpbusd (VNNI), so one instruction does 64
//                 multiply-adds into 16 int32 sums.
//
// Weight-only: the weights never exist in floating point in memory. Each loaded byte
// becomes fp32 in registers and is multiplied by the activation; the zero point and
// scale are applied once per group and row: y += s * (sum_k x_k q_k - zero * sum_k x_k),
// so the inner loop is convert + FMA. The same loop serves decode (1-8 token rows,
// streaming the weights once) and prefill: tokens are taken MT at a time against the
// same weight registers (a register-blocked GEMM; the block's weights stay in L1/L2
// between token tiles).
//
// W8A8: activations are quantized per row first (dynamic: scale = max|x| / 127;
// static: the calibrated scale and zero point), stored as u8 = q + 128 so vpdpbusd's
// unsigned x signed product applies; the +128 is removed with the precomputed row sums
// of the weights. Sums are exact int32. Without VNNI (AVX2, older AVX-512 CPUs) the same
// sums use vpmaddwd on int16-widened operands; the portable build runs plain loops.
#include <torch/all.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <vector>

// Both kernel layouts: the shared tree (csrc/cpu/*.h) and the x86 plugin's flat csrc.
#if __has_include("cpu/vec.h")
#include "cpu/parallel.h"
#include "cpu/vec.h"
#else
#include "parallel.h"
#include "vec.h"
#endif

#if !defined(GLOWLM_VEC_PORTABLE) && (defined(__AVX512F__) || defined(__AVX2__))
#include <immintrin.h>
#define GLOWLM_QUANT_X86 1
#endif

namespace glowlm {
namespace {

using vec::VecF;
constexpr int kRows = 16;                  // output rows per weight block
constexpr int kVecs = kRows / vec::W;      // registers per block (1 on AVX-512, 2 else)

// A layer's per-group dequantization constants: scale s and zero * s for each block of 16
// rows and group of columns, float or fp16 (S), or a fixed zero point (zs == nullptr).
template <typename S>
struct GroupScales {
  const S* scales;
  const S* zs;   // [N/16][G][16], or nullptr: symmetric, zero * s from `zero`
  float zero;    // the fixed zero point of symmetric weights, in q units
  int64_t G;

  // y[m] += s * a[m] - (zero * s + offset * s) * xs[m] for the W rows of register l of
  // the blocks b0, b0 + bs, b0 + 2 bs, ..., group g: the one epilogue of every weight-only
  // tile (the bf16-dot tile's sums carry 128 * sum(x) more, which offset = 128 removes).
  template <int MT, int L>
  void apply(int64_t b0, int64_t bs, int64_t g, float offset, const VecF (&a)[MT][L],
             const float* xs, float (&yv)[MT][L * vec::W]) const {
    GLOWLM_UNROLL for (int l = 0; l < L; ++l) {
      const int64_t at = ((b0 + l / kVecs * bs) * G + g) * kRows + (l % kVecs) * vec::W;
      const VecF s = vec::load(scales + at);
      const VecF z = zs ? vec::fmadd(vec::set1(offset), s, vec::load(zs + at))
                        : vec::mul(vec::set1(zero + offset), s);
      GLOWLM_UNROLL for (int m = 0; m < MT; ++m) {
        VecF y = vec::load(&yv[m][l * vec::W]);
        y = vec::fmadd(s, a[m][l], y);
        y = vec::fmadd(vec::sub(vec::zero(), z), vec::set1(xs[m * G + g]), y);
        vec::store(&yv[m][l * vec::W], y);
      }
    }
  }
  // The next groups' constants of block b into L1 ahead of their epilogue.
  void prefetch(int64_t b, int64_t g) const {
    vec::prefetch(scales + (b * G + g) * kRows);
    if (zs) vec::prefetch(zs + (b * G + g) * kRows);
  }
};

// W consecutive bytes -> fp32 (u8), or the low / high nibbles of them.
inline VecF u8_to_vec(const uint8_t* p) {
#if defined(GLOWLM_QUANT_X86) && defined(__AVX512F__)
  return {_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)p)))};
#elif defined(GLOWLM_QUANT_X86)
  return {_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)p)))};
#else
  float t[vec::W];
  for (int i = 0; i < vec::W; ++i) t[i] = static_cast<float>(p[i]);
  return vec::load(t);
#endif
}

// One 4-bit unit (W rows x 4 columns, 2W bytes: byte 2r + j holds column j in its low
// nibble and column 2 + j in its high one) -> the four columns as fp32, c[0..3].
inline void unit_to_vecs(const uint8_t* p, VecF* c) {
#if defined(GLOWLM_QUANT_X86) && defined(__AVX512F__)
  // Lane r = bytes 2r, 2r + 1: nibbles of columns 0, 2, 1, 3 at bits 0, 4, 8, 12.
  const __m512i b = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p));
  const __m512i f = _mm512_set1_epi32(15);
  c[0] = {_mm512_cvtepi32_ps(_mm512_and_si512(b, f))};
  c[2] = {_mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(b, 4), f))};
  c[1] = {_mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(b, 8), f))};
  c[3] = {_mm512_cvtepi32_ps(_mm512_srli_epi32(b, 12))};
#elif defined(GLOWLM_QUANT_X86)
  const __m256i b = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p));
  const __m256i f = _mm256_set1_epi32(15);
  c[0] = {_mm256_cvtepi32_ps(_mm256_and_si256(b, f))};
  c[2] = {_mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(b, 4), f))};
  c[1] = {_mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(b, 8), f))};
  c[3] = {_mm256_cvtepi32_ps(_mm256_srli_epi32(b, 12))};
#else
  float t[4][vec::W];
  for (int r = 0; r < vec::W; ++r)
    for (int j = 0; j < 2; ++j) {
      t[j][r] = static_cast<float>(p[2 * r + j] & 15);
      t[2 + j][r] = static_cast<float>(p[2 * r + j] >> 4);
    }
  for (int i = 0; i < 4; ++i) c[i] = vec::load(t[i]);
#endif
}

// A tile's MT x (NB blocks of 16) outputs, yv[m][nb * 16 + r], to rows b0 + nb * bs of out.
template <int MT, int NB>
inline void store_rows(const float (&yv)[MT][NB * kRows], int64_t b0, int64_t bs, float* out,
                       int64_t ldo) {
  GLOWLM_UNROLL for (int m = 0; m < MT; ++m)
    GLOWLM_UNROLL for (int nb = 0; nb < NB; ++nb)
      std::memcpy(out + m * ldo + (b0 + nb * bs) * kRows, yv[m] + nb * kRows,
                  sizeof(float) * kRows);
}

// How the weight-only kernels split their work: items of NB blocks bs apart, and token
// rows in chunks of 64 (long prefills: so both threads work when N is small). Decode
// (M <= 3) takes kDecodeNB blocks kDecodeStep apart on AVX-512 (64 rows from 4 x 256
// rows of the matrix): a few token rows do little arithmetic per weight byte, so what
// bounds them is how many cache lines are in flight, and 4 far-apart sequential streams
// per thread keep more in flight than 2 adjacent blocks (the dense GEMV's finding,
// cpu/gemv.h; bench_quant.cpp, one thread, 4-bit g128 bf16-dot, llama-1b shapes, M = 1:
// 2 adjacent blocks 65-80 % of a plain read, 4 adjacent 74-90 %, 4 blocks 4 apart
// 88-92 %, 2 blocks 8 apart 71-90 %; M = 2: 56-75 % -> 88-94 %; M = 3: 41-51 % ->
// 56-63 %, and the fp32 tiles gain too). From 4 token rows on the tiles keep 2 adjacent
// blocks (32 rows): the bf16-dot tile is bound by its dot products there, and 4 rows x 4
// blocks of accumulators would not fit the 32 registers. 8-lane ISAs: one block per item
// (a block is already two registers of each accumulator).
constexpr int kPrefillNB = kVecs == 1 ? 2 : 1;
constexpr int kDecodeNB = kVecs == 1 ? 4 : 1;
constexpr int64_t kDecodeStep = 4;

// rows(nb, m0, mn, b0, bs): token rows m0..m0+mn against blocks b0 + i * bs, i < nb (nb
// a std::integral_constant). Chunks of NB * bs blocks give bs items of NB blocks each;
// the blocks after the last whole chunk go one per item.
template <int NB, typename F>
void block_items(int64_t M, int64_t blocks, int64_t bs, const F& rows) {
  const int64_t whole = blocks / (NB * bs) * bs;  // items of NB blocks
  const int64_t items = whole + (blocks - whole * NB);
  constexpr int64_t kTokenChunk = 64;
  const int64_t mchunks = (M + kTokenChunk - 1) / kTokenChunk;
  parallel_chunks(items * mchunks, [&](int64_t i) {
    const int64_t item = i % items, m0 = i / items * kTokenChunk;
    const int64_t mn = std::min(kTokenChunk, M - m0);
    if (item < whole)
      rows(std::integral_constant<int, NB>{}, m0, mn, item / bs * NB * bs + item % bs, bs);
    else
      rows(std::integral_constant<int, 1>{}, m0, mn, whole * NB + item - whole, int64_t{1});
  });
}

// Decode's split by streams (M <= 3): the blocks cut into NB equal parts, far apart,
// and an item is a run of adjacent positions p, each tile taking block p of every part
// (bs = the part's length); blocks % NB left over go one per item. Why: a block is a
// short stream at small K (4.6 KiB at 4 bits, K = 576) and the kernels' software
// prefetch runs ahead of it into the next block, which block_items' items (blocks bs
// apart, taken in turns by the threads) had given to another thread: every block began
// with unprefetched lines. Runs of adjacent blocks keep each stream sequential across
// blocks (bench_quant gguf4 a8, Zen 2, 2 threads, M = 1, share of the read: 960 x 576
// 89 -> 114 %, 3072 x 576 72 -> 95 %, 576 x 1536 79 -> 85 %, 49152 x 576 68 -> 101 %).
// kRunsPerThread items per thread keep parallel_chunks' dynamic balance (a busy core
// does fewer runs) at runs still long enough to stream.
constexpr int64_t kRunsPerThread = 4;

template <int NB, typename F>
void stream_items(int64_t M, int64_t blocks, const F& rows) {
  const int64_t part = blocks / NB, tail = blocks - part * NB;
  const int64_t run = std::max<int64_t>(1, part / (num_threads() * kRunsPerThread));
  const int64_t items = (part + run - 1) / run;
  parallel_chunks(items + tail, [&](int64_t i) {
    if (i >= items) {
      rows(std::integral_constant<int, 1>{}, int64_t{0}, M, part * NB + i - items, int64_t{1});
      return;
    }
    for (int64_t p = i * run; p < std::min(part, (i + 1) * run); ++p)
      rows(std::integral_constant<int, NB>{}, int64_t{0}, M, p, part);
  });
}

// 8-lane ISAs decode one stream per item (the fp32 tile's registers hold one block);
// AVX-512 keeps kDecodeNB blocks kDecodeStep apart, as measured above (K >= 2048).
template <typename F>
void weight_only_items(int64_t M, int64_t blocks, const F& rows) {
  if (M <= 3 && kDecodeNB == 1) stream_items<1>(M, blocks, rows);
  else if (M <= 3) block_items<kDecodeNB>(M, blocks, kDecodeStep, rows);
  else block_items<kPrefillNB>(M, blocks, 1, rows);
}

// One tile: MT token rows x NB weight blocks (NB * 16 output rows), all of K.
// x: fp32 [M][K] (row stride K); xs: per-row group sums [M][G]; out: fp32 [M][ldo].
// 4 bits: one 4-column unit per step (32 bytes of a block); 8 bits: one column pair.
template <int BITS, int MT, int NB, typename S>
void wna16_tile(const float* x, const float* xs, int64_t K, int64_t G, int64_t group,
                const uint8_t* w, const GroupScales<S>& gsc, int64_t b0, int64_t bs,
                float* out, int64_t ldo) {
  constexpr int L = NB * kVecs;                    // fp32 registers of output rows
  constexpr int kCols = BITS == 4 ? 4 : 2;         // columns per step
  constexpr int64_t kStepBytes = kCols * kRows * BITS / 8;
  const int64_t block_bytes = K * kRows * BITS / 8;
  float yv[MT][L * vec::W];
  GLOWLM_UNROLL for (int m = 0; m < MT; ++m)
    GLOWLM_UNROLL for (int l = 0; l < L; ++l) vec::store(&yv[m][l * vec::W], vec::zero());
  const int64_t steps = group / kCols;
  for (int64_t g = 0; g < G; ++g) {
    VecF acc0[MT][L], acc1[MT][L];
    GLOWLM_UNROLL for (int m = 0; m < MT; ++m)
      GLOWLM_UNROLL for (int l = 0; l < L; ++l) acc0[m][l] = acc1[m][l] = vec::zero();
    for (int64_t st = g * steps; st < (g + 1) * steps; ++st) {
      const int64_t k = st * kCols;
      VecF c[kCols][L];
      GLOWLM_UNROLL for (int nb = 0; nb < NB; ++nb) {
        const uint8_t* p = w + (b0 + nb * bs) * block_bytes + st * kStepBytes;
        GLOWLM_UNROLL for (int v = 0; v < kVecs; ++v) {
          const int l = nb * kVecs + v;
          if constexpr (BITS == 4) {
            VecF u[4];
            unit_to_vecs(p + 2 * v * vec::W, u);
            GLOWLM_UNROLL for (int i = 0; i < 4; ++i) c[i][l] = u[i];
          } else {
            c[0][l] = u8_to_vec(p + v * vec::W);
            c[1][l] = u8_to_vec(p + kRows + v * vec::W);
          }
        }
      }
      GLOWLM_UNROLL for (int m = 0; m < MT; ++m) {
        GLOWLM_UNROLL for (int i = 0; i < kCols; ++i) {
          const VecF xv = vec::broadcast(x + m * K + k + i);
          GLOWLM_UNROLL for (int l = 0; l < L; ++l) {
            if (i % 2 == 0) acc0[m][l] = vec::fmadd(xv, c[i][l], acc0[m][l]);
            else acc1[m][l] = vec::fmadd(xv, c[i][l], acc1[m][l]);
          }
        }
      }
    }
    // y += s * sum(x q) - (zero * s) * sum(x), per row of the group.
    VecF a[MT][L];
    GLOWLM_UNROLL for (int m = 0; m < MT; ++m)
      GLOWLM_UNROLL for (int l = 0; l < L; ++l) a[m][l] = vec::add(acc0[m][l], acc1[m][l]);
    gsc.template apply<MT, L>(b0, bs, g, 0.0f, a, xs, yv);
  }
  store_rows<MT, NB>(yv, b0, bs, out, ldo);
}

template <int BITS, int NB, typename S>
void wna16_rows(const float* x, const float* xs, int64_t M, int64_t K, int64_t G,
                int64_t group, const uint8_t* w, const GroupScales<S>& gsc, int64_t npad,
                int64_t b0, int64_t bs, float* out) {
  int64_t m = 0;
  for (; m + 4 <= M; m += 4)
    wna16_tile<BITS, 4, NB>(x + m * K, xs + m * G, K, G, group, w, gsc, b0, bs,
                            out + m * npad, npad);
  for (; m + 2 <= M; m += 2)
    wna16_tile<BITS, 2, NB>(x + m * K, xs + m * G, K, G, group, w, gsc, b0, bs,
                            out + m * npad, npad);
  for (; m < M; ++m)
    wna16_tile<BITS, 1, NB>(x + m * K, xs + m * G, K, G, group, w, gsc, b0, bs,
                            out + m * npad, npad);
}

template <int BITS, typename S>
void wna16_run(const float* x, const float* xs, int64_t M, int64_t K, int64_t G,
               int64_t group, const uint8_t* w, const GroupScales<S>& gsc, int64_t npad,
               float* out) {
  weight_only_items(M, npad / kRows, [&](auto nb, int64_t m0, int64_t mn, int64_t b0,
                                         int64_t bs) {
    wna16_rows<BITS, decltype(nb)::value>(x + m0 * K, xs + m0 * G, mn, K, G, group, w, gsc,
                                          npad, b0, bs, out + m0 * npad);
  });
}

#if defined(GLOWLM_VEC_BF16DOT)
// 4-bit weights x bf16 activations with the pairwise bf16 dot product (vdpbf16ps on
// AVX512_BF16). Same layout, scales and epilogue as wna16_tile; the inner loop differs:
// a unit's 32 bytes become two registers of bf16 pairs, (128 + q[r][k], 128 + q[r][k+1])
// and (.. k + 2, k + 3) (vec::nibble_units, three logic ops), and one dot2 per register
// and token row multiplies them by that row's (x[k], x[k+1]) or (x[k+2], x[k+3]) into
// all 16 rows' sums. 128 + q is exact in bf16 and every product exact in fp32, so this
// is the fp32 path's sum on the bf16 activations plus 128 * sum(x), which the epilogue
// removes with the zero point — at a third of the fp32 path's instructions per weight
// byte (it converts every nibble to fp32 and does one FMA per 16 weights, not 32).
// U accumulator sets (lo, hi of U / 2 units) keep enough dot products in flight for one
// token row (decode), where MT x NB alone gives too few dependency chains.
constexpr int64_t kQuantAhead = 2048;

template <int MT, int NB, int U, typename S>
void wna16_bf16_tile(const bf16* x, const float* xs, int64_t K, int64_t G, int64_t group,
                     const uint8_t* w, const GroupScales<S>& gsc, int64_t b0, int64_t bs,
                     float* out, int64_t ldo) {
  static_assert(U % 2 == 0, "lo and hi of each unit take one accumulator set each");
  constexpr int L = NB * kVecs;
  constexpr int64_t kUnitBytes = 2 * kRows;
  const int64_t block_bytes = K * kRows / 2;
  float yv[MT][L * vec::W];
  GLOWLM_UNROLL for (int m = 0; m < MT; ++m)
    GLOWLM_UNROLL for (int l = 0; l < L; ++l) vec::store(&yv[m][l * vec::W], vec::zero());
  const int64_t units = group / 4;
  for (int64_t g = 0; g < G; ++g) {
    VecF acc[MT][L][U];
    GLOWLM_UNROLL for (int m = 0; m < MT; ++m)
      GLOWLM_UNROLL for (int l = 0; l < L; ++l)
        GLOWLM_UNROLL for (int u = 0; u < U; ++u) acc[m][l][u] = vec::zero();
    auto unit = [&](int64_t un, int a) {  // unit un into accumulator sets a, a + 1
      vec::VecBF lo[L], hi[L];
      GLOWLM_UNROLL for (int nb = 0; nb < NB; ++nb)
        GLOWLM_UNROLL for (int v = 0; v < kVecs; ++v)
          vec::nibble_units(w + (b0 + nb * bs) * block_bytes + un * kUnitBytes + 2 * v * vec::W,
                            lo[nb * kVecs + v], hi[nb * kVecs + v]);
      GLOWLM_UNROLL for (int m = 0; m < MT; ++m) {
        const vec::VecBF x01 = vec::broadcast_pair(x + m * K + 4 * un);
        const vec::VecBF x23 = vec::broadcast_pair(x + m * K + 4 * un + 2);
        GLOWLM_UNROLL for (int l = 0; l < L; ++l) {
          acc[m][l][a] = vec::dot2(acc[m][l][a], lo[l], x01);
          acc[m][l][a + 1] = vec::dot2(acc[m][l][a + 1], hi[l], x23);
        }
      }
    };
    const int64_t u0 = g * units, u1 = u0 + units;
    GLOWLM_UNROLL for (int nb = 0; nb < NB; ++nb) gsc.prefetch(b0 + nb * bs, g + 2);
    int64_t un = u0;
    for (; un + U / 2 <= u1; un += U / 2) {
      // Each block is a short stream (K / 2 * 16 bytes: 4.6 KiB at K = 576) that the
      // hardware prefetchers barely ramp up on; ask kQuantAhead bytes ahead ourselves.
      GLOWLM_UNROLL for (int nb = 0; nb < NB; ++nb)
        vec::prefetch(w + (b0 + nb * bs) * block_bytes + un * kUnitBytes + kQuantAhead);
      GLOWLM_UNROLL for (int i = 0; i < U / 2; ++i) unit(un + i, 2 * i);
    }
    for (; un < u1; ++un) unit(un, 0);  // a group of units not divisible by U / 2
    // y += s * (sum(x (128 + q)) - (zero + 128) * sum(x)), per row of the group.
    VecF a[MT][L];
    GLOWLM_UNROLL for (int m = 0; m < MT; ++m)
      GLOWLM_UNROLL for (int l = 0; l < L; ++l) {
        a[m][l] = acc[m][l][0];
        GLOWLM_UNROLL for (int u = 1; u < U; ++u) a[m][l] = vec::add(a[m][l], acc[m][l][u]);
      }
    gsc.template apply<MT, L>(b0, bs, g, 128.0f, a, xs, yv);
  }
  store_rows<MT, NB>(yv, b0, bs, out, ldo);
}

template <int NB, typename S>
void wna16_bf16_rows(const bf16* x, const float* xs, int64_t M, int64_t K, int64_t G,
                     int64_t group, const uint8_t* w, const GroupScales<S>& gsc, int64_t npad,
                     int64_t b0, int64_t bs, float* out) {
  int64_t m = 0;
  for (; m + 4 <= M; m += 4)
    wna16_bf16_tile<4, NB, 2>(x + m * K, xs + m * G, K, G, group, w, gsc, b0, bs,
                              out + m * npad, npad);
  for (; m + 2 <= M; m += 2)
    wna16_bf16_tile<2, NB, 2>(x + m * K, xs + m * G, K, G, group, w, gsc, b0, bs,
                              out + m * npad, npad);
  for (; m < M; ++m)
    wna16_bf16_tile<1, NB, 4>(x + m * K, xs + m * G, K, G, group, w, gsc, b0, bs,
                              out + m * npad, npad);
}

template <typename S>
void wna16_bf16_run(const bf16* x, const float* xs, int64_t M, int64_t K, int64_t G,
                    int64_t group, const uint8_t* w, const GroupScales<S>& gsc, int64_t npad,
                    float* out) {
  weight_only_items(M, npad / kRows, [&](auto nb, int64_t m0, int64_t mn, int64_t b0,
                                         int64_t bs) {
    wna16_bf16_rows<decltype(nb)::value>(x + m0 * K, xs + m0 * G, mn, K, G, group, w, gsc,
                                         npad, b0, bs, out + m0 * npad);
  });
}
#endif

// xs[m, g]: the sum of row m's activations over column group g, as the kernels see them
// (vectors of W, then the group's tail; bf16 and its fp32 copy give the same sums, so the
// bf16-dot and fp32 paths subtract the same zero * sum(x)). Decode runs this on one
// thread before the kernel: a scalar loop was one dependent add per column.
template <typename T>
void group_sums(const T* x, int64_t M, int64_t K, int64_t group, float* xs) {
  const int64_t G = K / group;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t g = 0; g < G; ++g) {
      const T* p = x + m * K + g * group;
      int64_t k = 0;
      VecF acc = vec::zero();
      for (; k + vec::W <= group; k += vec::W) acc = vec::add(acc, vec::load(p + k));
      float s = vec::reduce_add(acc);
      for (; k < group; ++k) s += vec::to_float(p[k]);
      xs[m * G + g] = s;
    }
}

// The first n of npad fp32 columns (+ bias) in the activations' dtype, in one pass.
at::Tensor finish(const at::Tensor& acc, int64_t n, const std::optional<at::Tensor>& bias,
                  at::ScalarType dtype) {
  const int64_t M = acc.size(0), npad = acc.size(1);
  at::Tensor b;
  if (bias.has_value()) b = bias->to(at::kFloat).contiguous();
  const float* bp = b.defined() ? b.data_ptr<float>() : nullptr;
  const float* a = acc.data_ptr<float>();
  auto emit = [&](auto* o) {  // vectors of W (one rounding each, as from_float), then a tail
    using T = std::remove_pointer_t<decltype(o)>;
    for (int64_t m = 0; m < M; ++m) {
      int64_t j = 0;
      for (; j + vec::W <= n; j += vec::W) {
        const VecF v = vec::load(a + m * npad + j);
        vec::store(o + m * n + j, bp ? vec::add(v, vec::load(bp + j)) : v);
      }
      for (; j < n; ++j) o[m * n + j] = vec::from_float<T>(a[m * npad + j] + (bp ? bp[j] : 0.f));
    }
  };
  if (dtype == at::kFloat && npad == n && bp == nullptr) return acc;
  at::Tensor y = at::empty({M, n}, acc.options().dtype(dtype));
  if (dtype == at::kFloat) emit(y.data_ptr<float>());
  else if (dtype == at::kBFloat16) emit(reinterpret_cast<bf16*>(y.data_ptr<at::BFloat16>()));
  else if (dtype == at::kHalf) emit(reinterpret_cast<fp16*>(y.data_ptr<at::Half>()));
  else return (acc.narrow(1, 0, n) + (b.defined() ? b : at::zeros({n}, acc.options()))).to(dtype);
  return y;
}

}  // namespace

at::Tensor wna16_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scales,
                        const at::Tensor& zs, int64_t bits, int64_t group_size, int64_t n,
                        const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2, "wna16_linear: x must be [M, K]");
  TORCH_CHECK(bits == 4 || bits == 8, "wna16_linear: bits must be 4 or 8");
  TORCH_CHECK(weight.scalar_type() == at::kByte && weight.is_contiguous(),
              "wna16_linear: weight must be contiguous uint8 (prepared layout)");
  const auto sdt = scales.scalar_type();
  const bool sym = zs.numel() == 0;
  TORCH_CHECK((sdt == at::kFloat || sdt == at::kHalf) && scales.is_contiguous() &&
                  scales.dim() == 3 && scales.size(2) == kRows &&
                  (sym || (zs.scalar_type() == sdt && zs.is_contiguous() &&
                           zs.sizes() == scales.sizes())),
              "wna16_linear: scales must be contiguous float32 or float16 [N/16, G, 16], and "
              "zs the same or empty (symmetric)");
  const int64_t M = x.size(0), K = x.size(1), G = scales.size(1), npad = scales.size(0) * kRows;
  TORCH_CHECK(group_size % (bits == 4 ? 4 : 2) == 0 && G * group_size == K, "wna16_linear: K ",
              K, " is not ", G, " groups of ", group_size, " (a multiple of ", 16 / bits, ")");
  TORCH_CHECK(npad % kRows == 0 && n <= npad && weight.numel() == npad * K * bits / 8,
              "wna16_linear: weight does not match N ", npad, " x K ", K);
  at::Tensor out = at::empty({M, npad}, x.options().dtype(at::kFloat));
  if (M == 0) return finish(out, n, bias, x.scalar_type());
  const uint8_t* w = weight.data_ptr<uint8_t>();
  std::vector<float> xs(static_cast<size_t>(M * G));
  const float zero = static_cast<float>(1 << (bits - 1));  // symmetric weights' zero point
  auto run = [&](const auto* sp) {
    using S = std::remove_const_t<std::remove_pointer_t<decltype(sp)>>;
    const GroupScales<S> gsc{sp, sym ? nullptr : static_cast<const S*>(zs.data_ptr()), zero, G};
#if defined(GLOWLM_VEC_BF16DOT)
    if (bits == 4 && x.scalar_type() == at::kBFloat16) {
      at::Tensor xb = x.contiguous();
      const bf16* xp = reinterpret_cast<const bf16*>(xb.data_ptr<at::BFloat16>());
      group_sums(xp, M, K, group_size, xs.data());
      wna16_bf16_run(xp, xs.data(), M, K, G, group_size, w, gsc, npad, out.data_ptr<float>());
      return;
    }
#endif
    at::Tensor xf = x.to(at::kFloat).contiguous();
    const float* xp = xf.data_ptr<float>();
    group_sums(xp, M, K, group_size, xs.data());
    if (bits == 4)
      wna16_run<4>(xp, xs.data(), M, K, G, group_size, w, gsc, npad, out.data_ptr<float>());
    else
      wna16_run<8>(xp, xs.data(), M, K, G, group_size, w, gsc, npad, out.data_ptr<float>());
  };
  if (sdt == at::kHalf) run(reinterpret_cast<const fp16*>(scales.data_ptr<at::Half>()));
  else run(scales.data_ptr<float>());
  return finish(out, n, bias, x.scalar_type());
}

// ---------------------------------------------------------------------------- W8A8

namespace {

// max |x[k]| (0 for an empty row; NaNs are skipped, as std::max(amax, NaN) keeps amax).
float abs_max(const float* x, int64_t K) {
  float amax = 0.f;
  int64_t k = 0;
#if defined(GLOWLM_QUANT_X86) && defined(__AVX512F__)
  // Decode quantizes one row per projection on one thread before the kernel's parallel
  // region: at K = 2048 the scalar loops were a few microseconds of every W8A8 call.
  __m512 m = _mm512_setzero_ps();
  for (; k + 16 <= K; k += 16)  // vmaxps returns its second operand if either is NaN
    m = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x + k)), m);
  amax = _mm512_reduce_max_ps(m);
#endif
  for (; k < K; ++k) amax = std::max(amax, std::fabs(x[k]));
  return amax;
}

// out[k] = u8(clamp(nearbyint(x[k] * inv) + zp, lo, 127) + 128) for k < K (a NaN gives lo).
void quantize_values(const float* x, int64_t K, float inv, float zp, float lo, uint8_t* out) {
  int64_t k = 0;
#if defined(GLOWLM_QUANT_X86) && defined(__AVX512F__)
  // The same operations as the scalar loop, lane-wise: one fp32 product, rounding to
  // nearest even, an exact integer add, clamps (vmaxps(q, lo) is lo for a NaN q, as
  // std::max(lo, q)), so the bytes are identical.
  const __m512 vinv = _mm512_set1_ps(inv), vzp = _mm512_set1_ps(zp);
  const __m512 vlo = _mm512_set1_ps(lo), vhi = _mm512_set1_ps(127.f);
  for (; k + 16 <= K; k += 16) {
    __m512 q = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_loadu_ps(x + k), vinv),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    q = _mm512_min_ps(_mm512_max_ps(_mm512_add_ps(q, vzp), vlo), vhi);
    const __m512i u = _mm512_add_epi32(_mm512_cvtps_epi32(q), _mm512_set1_epi32(128));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + k), _mm512_cvtepi32_epi8(u));
  }
#endif
  for (; k < K; ++k) {
    float q = std::nearbyint(x[k] * inv) + zp;
    q = std::min(127.f, std::max(lo, q));
    out[k] = static_cast<uint8_t>(static_cast<int>(q) + 128);
  }
}

// Quantize one row to u8 = q + 128 (K padded to kp with q = 0); returns the scale.
// Dynamic (input_scale <= 0): scale = max|x| / 127, q in [-127, 127]; static: the
// calibrated scale and zero point, q in [-128, 127].
float quantize_row(const float* x, int64_t K, int64_t kp, double input_scale, int64_t zp,
                   uint8_t* out) {
  float scale;
  if (input_scale <= 0) {
    const float amax = abs_max(x, K);
    // amax == 0: every q is 0 whatever inv is.
    quantize_values(x, K, amax > 0 ? 127.0f / amax : 127.0f, 0.f, -127.f, out);
    scale = amax > 0 ? amax / 127.0f : 1.0f;
  } else {
    quantize_values(x, K, static_cast<float>(1.0 / input_scale), static_cast<float>(zp),
                    -128.f, out);
    scale = static_cast<float>(input_scale);
  }
  // Padding columns meet zero weights; any value is exact. Use q = 0.
  for (int64_t k = K; k < kp; ++k) out[k] = 128;
  return scale;
}

// int32 sums of one 16-row block for MT token rows: acc[m][r] = sum_k xq[m][k] * w[r][k].
template <int MT>
void w8a8_block_generic(const uint8_t* xq, int64_t kp, const int8_t* w, int32_t* acc) {
  for (int m = 0; m < MT; ++m)
    for (int r = 0; r < kRows; ++r) acc[m * kRows + r] = 0;
  for (int64_t q = 0; q < kp / 4; ++q) {
    const int8_t* wq = w + q * kRows * 4;
    for (int m = 0; m < MT; ++m) {
      const uint8_t* xm = xq + m * kp + q * 4;
      for (int r = 0; r < kRows; ++r) {
        int32_t s = 0;
        for (int j = 0; j < 4; ++j) s += int32_t(xm[j]) * int32_t(wq[r * 4 + j]);
        acc[m * kRows + r] += s;
      }
    }
  }
}

#if defined(GLOWLM_QUANT_X86)
// One 16-row block for MT token rows without VNNI (AVX2, or AVX-512 CPUs without it):
// weights widened to int16 and vpmaddwd against the u8 activations widened likewise.
// Exact: |u8 * s8| <= 255 * 128 and a pair fits int32 (vpmaddubsw would saturate int16).
template <int MT>
void w8a8_block_madd(const uint8_t* xq, int64_t kp, const int8_t* w, int32_t* acc) {
  __m256i a[MT][4];
  GLOWLM_UNROLL for (int m = 0; m < MT; ++m)
    GLOWLM_UNROLL for (int j = 0; j < 4; ++j) a[m][j] = _mm256_setzero_si256();
  for (int64_t q = 0; q < kp / 4; ++q) {
    __m256i wv[4];  // rows 4j..4j+3, 4 columns each, as int16
    GLOWLM_UNROLL for (int j = 0; j < 4; ++j)
      wv[j] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(w + q * 64 + 16 * j)));
    GLOWLM_UNROLL for (int m = 0; m < MT; ++m) {
      int32_t xv;
      std::memcpy(&xv, xq + m * kp + q * 4, 4);
      const __m256i xb = _mm256_broadcastq_epi64(_mm_cvtepu8_epi16(_mm_cvtsi32_si128(xv)));
      GLOWLM_UNROLL for (int j = 0; j < 4; ++j)
        a[m][j] = _mm256_add_epi32(a[m][j], _mm256_madd_epi16(wv[j], xb));
    }
  }
  GLOWLM_UNROLL for (int m = 0; m < MT; ++m)
    GLOWLM_UNROLL for (int j = 0; j < 4; ++j) {
      alignas(32) int32_t t[8];
      _mm256_store_si256((__m256i*)t, a[m][j]);
      for (int r = 0; r < 4; ++r) acc[m * kRows + 4 * j + r] = t[2 * r] + t[2 * r + 1];
    }
}
#endif

#if defined(GLOWLM_QUANT_X86) && defined(__AVX512F__)
// MT token rows x NB blocks (block_bytes apart) with vpdpbusd: per 4 columns, one 64-byte
// weight load per block and one instruction per (token, block). No software prefetch: a
// block is one long sequential stream (16 * K bytes), and prefetching 512 or 1,024 bytes
// ahead measured the same as none (bench_quant w8a8, Ice Lake guest, 2 threads, M = 1).
template <int MT, int NB>
__attribute__((target("avx512vnni"))) void w8a8_tile_vnni(const uint8_t* xq, int64_t kp,
                                                          const int8_t* w, int64_t block_bytes,
                                                          int32_t* acc) {
  __m512i a[MT][NB];
  GLOWLM_UNROLL for (int m = 0; m < MT; ++m)
    GLOWLM_UNROLL for (int nb = 0; nb < NB; ++nb) a[m][nb] = _mm512_setzero_si512();
  for (int64_t q = 0; q < kp / 4; ++q) {
    __m512i wv[NB];
    GLOWLM_UNROLL for (int nb = 0; nb < NB; ++nb)
      wv[nb] = _mm512_loadu_si512((const void*)(w + nb * block_bytes + q * 64));
    GLOWLM_UNROLL for (int m = 0; m < MT; ++m) {
      int32_t xv;
      std::memcpy(&xv, xq + m * kp + q * 4, 4);
      const __m512i xb = _mm512_set1_epi32(xv);
      GLOWLM_UNROLL for (int nb = 0; nb < NB; ++nb)
        a[m][nb] = _mm512_dpbusd_epi32(a[m][nb], xb, wv[nb]);
    }
  }
  GLOWLM_UNROLL for (int m = 0; m < MT; ++m)
    GLOWLM_UNROLL for (int nb = 0; nb < NB; ++nb)
      _mm512_storeu_si512((void*)(acc + (m * NB + nb) * kRows), a[m][nb]);
}

// w8a8_tile_vnni for a run-time number of token rows, 1 <= mt <= 4.
template <int NB>
void w8a8_tile_vnni_rows(int mt, const uint8_t* xq, int64_t kp, const int8_t* w,
                         int64_t block_bytes, int32_t* acc) {
  switch (mt) {
    case 4: return w8a8_tile_vnni<4, NB>(xq, kp, w, block_bytes, acc);
    case 3: return w8a8_tile_vnni<3, NB>(xq, kp, w, block_bytes, acc);
    case 2: return w8a8_tile_vnni<2, NB>(xq, kp, w, block_bytes, acc);
    default: return w8a8_tile_vnni<1, NB>(xq, kp, w, block_bytes, acc);
  }
}

bool has_vnni() {
  static const bool yes = __builtin_cpu_supports("avx512vnni");
  return yes;
}
#endif

}  // namespace

at::Tensor w8a8_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& wscale,
                       const at::Tensor& wsum, double input_scale, int64_t input_zp, int64_t n,
                       const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2, "w8a8_linear: x must be [M, K]");
  TORCH_CHECK(weight.scalar_type() == at::kChar && weight.is_contiguous() && weight.dim() == 4 &&
                  weight.size(2) == kRows && weight.size(3) == 4,
              "w8a8_linear: weight must be int8 [N/16, K/4, 16, 4]");
  TORCH_CHECK(wscale.scalar_type() == at::kFloat && wsum.scalar_type() == at::kInt,
              "w8a8_linear: wscale float32 and wsum int32 [Npad]");
  const int64_t M = x.size(0), K = x.size(1);
  const int64_t blocks = weight.size(0), kp = weight.size(1) * 4, npad = blocks * kRows;
  TORCH_CHECK(kp >= K && kp - K < 4 && n <= npad && wscale.numel() == npad &&
                  wsum.numel() == npad,
              "w8a8_linear: weight does not match K ", K);
  at::Tensor xf = x.to(at::kFloat).contiguous();
  std::vector<uint8_t> xq(static_cast<size_t>(M * kp));
  std::vector<float> sx(static_cast<size_t>(M));
  const float* xp = xf.data_ptr<float>();
  for (int64_t m = 0; m < M; ++m)
    sx[m] = quantize_row(xp + m * K, K, kp, input_scale, input_zp, xq.data() + m * kp);
  at::Tensor out = at::empty({M, npad}, x.options().dtype(at::kFloat));
  float* o = out.data_ptr<float>();
  const int8_t* w = weight.data_ptr<int8_t>();
  const float* ws = wscale.data_ptr<float>();
  const int32_t* wsm = wsum.data_ptr<int32_t>();
  const int32_t offset = 128 + static_cast<int32_t>(input_zp);
  const int64_t block_bytes = kp * kRows;
  constexpr int NB = 4;  // blocks per work item (64 rows): independent VNNI chains
  // acc layout: [(m * nbt + nb) * 16 + r], blocks b + nb * bs.
  auto emit = [&](const int32_t* acc, int64_t m0, int mt, int64_t b, int nbt, int64_t bs) {
    for (int m = 0; m < mt; ++m)
      for (int nb = 0; nb < nbt; ++nb)
        for (int r = 0; r < kRows; ++r) {
          const int64_t row = (b + nb * bs) * kRows + r;
          const int32_t s = acc[(m * nbt + nb) * kRows + r] - offset * wsm[row];
          o[(m0 + m) * npad + row] = sx[m0 + m] * ws[row] * static_cast<float>(s);
        }
  };
#if defined(GLOWLM_QUANT_X86) && defined(__AVX512F__)
  // Decode (M <= 3) with VNNI: one tile takes all M token rows against NB blocks far
  // apart (stream_items: the blocks cut into NB parts, a work item a run of adjacent
  // positions in every part), so every weight byte is loaded once per call. The items
  // below ran one pass per token row (the later passes from L2): M = 2 reached 64-93 %
  // of a plain read on the llama-1b shapes, one pass 71-108 % (+10-20 %); M = 1 is the
  // same either way, 96-105 % (bench_quant w8a8, Ice Lake guest, 2 threads, two rounds).
  if (has_vnni() && M <= 3) {
    const uint8_t* xqp = xq.data();
    stream_items<NB>(M, blocks, [&](auto nbc, int64_t, int64_t, int64_t b, int64_t bs) {
      constexpr int nbt = decltype(nbc)::value;
      int32_t acc[3 * nbt * kRows];
      w8a8_tile_vnni_rows<nbt>(static_cast<int>(M), xqp, kp, w + b * block_bytes,
                               bs * block_bytes, acc);
      emit(acc, 0, static_cast<int>(M), b, nbt, bs);
    });
    return finish(out, n, bias, x.scalar_type());
  }
#endif
  const int64_t items = (blocks + NB - 1) / NB;
  parallel_chunks(items, [&](int64_t item) {
    int32_t acc[4 * NB * kRows];
    const int64_t b0 = item * NB, nb_here = std::min<int64_t>(NB, blocks - b0);
    for (int64_t m = 0; m < M;) {
#if defined(GLOWLM_QUANT_X86) && defined(__AVX512F__)
      if (has_vnni() && nb_here == NB) {
        const uint8_t* xm = xq.data() + m * kp;
        const int8_t* wb = w + b0 * block_bytes;
        const int mt = static_cast<int>(std::min<int64_t>(4, M - m));
        w8a8_tile_vnni_rows<NB>(mt, xm, kp, wb, block_bytes, acc);
        emit(acc, m, mt, b0, NB, 1);
        m += mt;
        continue;
      }
#endif
#if defined(GLOWLM_QUANT_X86)
      if (M - m >= 2) {
        for (int64_t b = b0; b < b0 + nb_here; ++b) {
          w8a8_block_madd<2>(xq.data() + m * kp, kp, w + b * block_bytes, acc);
          emit(acc, m, 2, b, 1, 1);
        }
        m += 2;
        continue;
      }
      for (int64_t b = b0; b < b0 + nb_here; ++b) {
        w8a8_block_madd<1>(xq.data() + m * kp, kp, w + b * block_bytes, acc);
        emit(acc, m, 1, b, 1, 1);
      }
#else
      for (int64_t b = b0; b < b0 + nb_here; ++b) {
        w8a8_block_generic<1>(xq.data() + m * kp, kp, w + b * block_bytes, acc);
        emit(acc, m, 1, b, 1, 1);
      }
#endif
      m += 1;
    }
  });
  return finish(out, n, bias, x.scalar_type());
}

// The activations of w8a8_linear as int8 values and per-row scales, for another int8
// GEMM over the same weights (the measured linear choice's torch._int_mm candidate):
// quantize_row's bytes minus 128, so the integers are exactly the ones w8a8_linear sums.
std::tuple<at::Tensor, at::Tensor> quantize_rows(const at::Tensor& x, double input_scale,
                                                 int64_t input_zp) {
  TORCH_CHECK(x.dim() == 2, "quantize_rows: x must be [M, K]");
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  const int64_t M = x.size(0), K = x.size(1);
  at::Tensor q = at::empty({M, K}, x.options().dtype(at::kChar));
  at::Tensor scale = at::empty({M, 1}, x.options().dtype(at::kFloat));
  const float* xp = xf.data_ptr<float>();
  uint8_t* qp = reinterpret_cast<uint8_t*>(q.data_ptr<int8_t>());
  float* sp = scale.data_ptr<float>();
  parallel_chunks(M, [&](int64_t m) {
    uint8_t* row = qp + m * K;
    sp[m] = quantize_row(xp + m * K, K, K, input_scale, input_zp, row);
    for (int64_t k = 0; k < K; ++k) row[k] ^= 0x80;  // u8 = q + 128 -> int8 q
  });
  return {q, scale};
}

// ------------------------------------------- weight-only x int8 activations (wna8)
//
// The same weight-only weights with the activations quantized to int8 per block of 32
// columns at run time (d = max|x| / 127 per block, q = nearbyint(x * 127 / max|x|), the
// W8A8 dynamic rule per block): what ggml does for every quantized GGUF type on every CPU
// (it multiplies Q4_0/Q4_1/K-quant blocks by Q8_0/Q8_1/Q8_K activations), so a GGUF
// model's reference implementation computes exactly these products, and the plain
// weight-only path above is the more precise one. Why: without a bf16 or int8 dot product
// the fp32 path converts every weight to fp32 and does one FMA per weight and token row
// (~36 instructions per 64 4-bit weights on AVX2), which is bound by those instructions,
// not by memory, at decode (Zen 2, AVX2, 2 threads, bench_quant gguf4/gguf8, M = 1: 4-bit
// 37-58 % of the read bandwidth, 8-bit 54-68 %; this path 68-97 % and 80-101 %). Here a
// 32-byte unit of 64 nibbles goes through vpmaddubsw
// (u8 x s8 -> int16 pairs) twice per token row: its low nibbles are (row r, columns k,
// k + 1) pairs and its high ones (r, k + 2, k + 3), the layout's own order. Sums are exact
// integers: one column's product is at most 15 * 127, so 16 columns fit int16 (30 480);
// every 16 columns go to int32, every 32 to fp32 with the block's d. 8-bit weights use
// W8A8's layout ([N/16][K/4][16][4], signed q - 128: prepared for this path): vpmaddubsw
// on |w| and sign(x, w), then vpmaddwd to int32 (a pair is at most 2 * 128 * 127).
// The epilogue is wna16's: y += s * sum(q x^) - zero * s * sum(x^), sum(x^) = d * sum(q_x).
namespace {

constexpr int64_t kActBlock = 32;  // activation columns per int8 scale

// Column runs of one group: the columns summed in int16 (4 bits) / int32 before the block
// scale d applies. A group of 16 is one run in one block; larger groups are runs of 32.
inline int64_t run_cols(int64_t group) { return std::min<int64_t>(group, kActBlock); }


#if defined(GLOWLM_QUANT_X86)
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const bf16* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline __m256 load8(const fp16* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
#endif

// Blocks whose max|x| is below this quantize to zeros (d = 1): 127 / max|x| overflows
// float32 below ~3.7e-37, and inf * 0 would be NaN, i.e. -127. Such values are zeros to
// any model; core's reference (quantize_act_blocks) has the same rule.
constexpr float kTinyAmax = 1e-30f;

inline float zero_block(int8_t* q, int32_t* h) {
  std::memset(q, 0, kActBlock);
  h[0] = h[1] = 0;
  return 1.0f;
}

// One block of 32 activations -> int8 q[0..32), returns d; h[0], h[1]: the sums of q over
// columns 0-15 and 16-31. The W8A8 dynamic rule per block: inv = 127 / max|x|, q =
// nearbyint(x * inv) clamped to [-127, 127] (a NaN gives -127, as quantize_values), d =
// max|x| / 127 (1 for an all-zero block). Decode quantizes one row per projection on one
// thread before the parallel region, so AVX2 does the same operations lane-wise (the
// same bytes): scalar loops were twice the 4-bit kernel's own time at K = 16384.
template <typename T>
float quantize_block(const T* x, int8_t* q, int32_t* h) {
  float amax;
#if defined(GLOWLM_QUANT_X86)
  __m256 v[4];
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 m = _mm256_setzero_ps();
  for (int i = 0; i < 4; ++i) {
    v[i] = load8(x + 8 * i);
    m = _mm256_max_ps(_mm256_andnot_ps(sign, v[i]), m);  // NaN lanes keep m
  }
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  amax = _mm_cvtss_f32(m4);
  if (!(amax >= kTinyAmax)) return zero_block(q, h);
  const __m256 inv = _mm256_set1_ps(127.0f / amax);
  const __m256 lo = _mm256_set1_ps(-127.f), hi = _mm256_set1_ps(127.f);
  __m256i qi[4];
  for (int i = 0; i < 4; ++i) {
    __m256 r = _mm256_round_ps(_mm256_mul_ps(v[i], inv),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    r = _mm256_min_ps(_mm256_max_ps(r, lo), hi);  // vmaxps(r, lo) is lo for a NaN r
    qi[i] = _mm256_cvtps_epi32(r);
  }
  auto hsum = [](__m256i a) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
  };
  h[0] = hsum(_mm256_add_epi32(qi[0], qi[1]));
  h[1] = hsum(_mm256_add_epi32(qi[2], qi[3]));
  // int32 -> int16 -> int8 (values fit, no saturation); packs interleave 128-bit lanes,
  // which the final permute undoes.
  const __m256i w16a = _mm256_packs_epi32(qi[0], qi[1]), w16b = _mm256_packs_epi32(qi[2], qi[3]);
  const __m256i b8 = _mm256_packs_epi16(w16a, w16b);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q),
                      _mm256_permutevar8x32_epi32(b8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  return amax / 127.0f;
#else
  float xf[kActBlock];
  for (int64_t k = 0; k < kActBlock; ++k) xf[k] = vec::to_float(x[k]);
  amax = abs_max(xf, kActBlock);
  if (!(amax >= kTinyAmax)) return zero_block(q, h);
  uint8_t u[kActBlock];
  quantize_values(xf, kActBlock, 127.0f / amax, 0.f, -127.f, u);
  h[0] = h[1] = 0;
  for (int64_t k = 0; k < kActBlock; ++k) {
    q[k] = static_cast<int8_t>(static_cast<int>(u[k]) - 128);
    h[k / 16] += q[k];
  }
  return amax / 127.0f;
#endif
}

// Row m of x -> int8 q[m][K], d[m][K/32], and xs[m][g] = sum over group g of d * q
// (the quantized activations' sum, which the zero point multiplies).
template <typename T>
void quantize_act_blocks(const T* x, int64_t M, int64_t K, int64_t group, int8_t* q,
                         float* d, float* xs) {
  const int64_t nb = K / kActBlock, G = K / group;
  std::vector<int32_t> halves(static_cast<size_t>(2 * nb));
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t b = 0; b < nb; ++b)
      d[m * nb + b] = quantize_block(x + m * K + b * kActBlock, q + m * K + b * kActBlock,
                                     halves.data() + 2 * b);
    for (int64_t g = 0; g < G; ++g) {  // a group is half a block, one block, or several
      if (group == 16) {
        xs[m * G + g] = d[m * nb + g / 2] * static_cast<float>(halves[g]);
        continue;
      }
      float t = 0.f;
      for (int64_t b = g * group / kActBlock; b < (g + 1) * group / kActBlock; ++b)
        t += d[m * nb + b] * static_cast<float>(halves[2 * b] + halves[2 * b + 1]);
      xs[m * G + g] = t;
    }
  }
}

#if defined(GLOWLM_QUANT_X86)
// Two int32 registers (rows 0-7, 8-15) -> kVecs fp32 registers, added to f as d * sum.
inline void add_rows32(__m256i lo, __m256i hi, VecF d, VecF* f) {
#if defined(__AVX512F__)
  const __m512i s = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
  f[0] = vec::fmadd(d, {_mm512_cvtepi32_ps(s)}, f[0]);
#else
  f[0] = vec::fmadd(d, {_mm256_cvtepi32_ps(lo)}, f[0]);
  f[1] = vec::fmadd(d, {_mm256_cvtepi32_ps(hi)}, f[1]);
#endif
}

inline __m256i bcast16(const int8_t* p) {
  int16_t v;
  std::memcpy(&v, p, 2);
  return _mm256_set1_epi16(v);
}

inline __m256i bcast32(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// Software prefetch distance of the weight streams: a block is a short stream (K * 8
// bytes at 4 bits: 4.6 KiB at K = 576) that the hardware prefetchers barely ramp up on.
constexpr int64_t kWna8Ahead = 2048;


// One run of rc columns (k0 ...) of 4-bit weights into i32 (rows 0-7, 8-15 of each
// block): every 16 columns, 4 units of int16 sums (at most 30 480), widened to int32.
template <int MT, int NB>
inline void run4(const int8_t* xq, int64_t K, const uint8_t* w, int64_t block_bytes,
                 int64_t b0, int64_t bs, int64_t k0, int64_t rc, __m256i (&i32)[MT][NB][2]) {
  const __m256i mask = _mm256_set1_epi8(0x0F);
  for (int64_t h = k0; h < k0 + rc; h += 16) {
    __m256i s16[MT][NB];
    GLOWLM_UNROLL for (int m = 0; m < MT; ++m)
      GLOWLM_UNROLL for (int i = 0; i < NB; ++i) s16[m][i] = _mm256_setzero_si256();
    GLOWLM_UNROLL for (int i = 0; i < NB; ++i)  // 16 columns: 128 bytes, 2 lines
      GLOWLM_UNROLL for (int j = 0; j < 2; ++j)
        vec::prefetch(w + (b0 + i * bs) * block_bytes + h * 8 + 64 * j + kWna8Ahead);
    GLOWLM_UNROLL for (int u = 0; u < 4; ++u) {
      const int64_t k = h + 4 * u;
      __m256i lo[NB], hi[NB];
      GLOWLM_UNROLL for (int i = 0; i < NB; ++i) {
        const __m256i v = _mm256_loadu_si256(
            reinterpret_cast<const __m256i*>(w + (b0 + i * bs) * block_bytes + k * 8));
        lo[i] = _mm256_and_si256(v, mask);
        hi[i] = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
      }
      GLOWLM_UNROLL for (int m = 0; m < MT; ++m) {
        const __m256i x01 = bcast16(xq + m * K + k), x23 = bcast16(xq + m * K + k + 2);
        GLOWLM_UNROLL for (int i = 0; i < NB; ++i) {
          s16[m][i] = _mm256_add_epi16(s16[m][i], _mm256_maddubs_epi16(lo[i], x01));
          s16[m][i] = _mm256_add_epi16(s16[m][i], _mm256_maddubs_epi16(hi[i], x23));
        }
      }
    }
    GLOWLM_UNROLL for (int m = 0; m < MT; ++m)
      GLOWLM_UNROLL for (int i = 0; i < NB; ++i) {
        i32[m][i][0] = _mm256_add_epi32(
            i32[m][i][0], _mm256_cvtepi16_epi32(_mm256_castsi256_si128(s16[m][i])));
        i32[m][i][1] = _mm256_add_epi32(
            i32[m][i][1], _mm256_cvtepi16_epi32(_mm256_extracti128_si256(s16[m][i], 1)));
      }
  }
}

// The same for 8-bit weights in W8A8's layout (signed q - 128, 4 columns per row and
// step, 64 bytes per block): vpmaddubsw on |w| and sign(x, w), vpmaddwd to int32.
template <int MT, int NB>
inline void run8(const int8_t* xq, int64_t K, const int8_t* w, int64_t block_bytes,
                 int64_t b0, int64_t bs, int64_t k0, int64_t rc, __m256i (&i32)[MT][NB][2]) {
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t k = k0; k < k0 + rc; k += 4) {
    __m256i wa[NB][2], ws[NB][2];
    GLOWLM_UNROLL for (int i = 0; i < NB; ++i) {
      const int8_t* p = w + (b0 + i * bs) * block_bytes + k * kRows;
      vec::prefetch(p + kWna8Ahead);  // 4 columns: one 64-byte line
      GLOWLM_UNROLL for (int j = 0; j < 2; ++j) {
        ws[i][j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 * j));
        wa[i][j] = _mm256_abs_epi8(ws[i][j]);
      }
    }
    GLOWLM_UNROLL for (int m = 0; m < MT; ++m) {
      const __m256i xv = bcast32(xq + m * K + k);
      GLOWLM_UNROLL for (int i = 0; i < NB; ++i)
        GLOWLM_UNROLL for (int j = 0; j < 2; ++j) {
          const __m256i p16 = _mm256_maddubs_epi16(wa[i][j], _mm256_sign_epi8(xv, ws[i][j]));
          i32[m][i][j] = _mm256_add_epi32(i32[m][i][j], _mm256_madd_epi16(p16, ones));
        }
    }
  }
}

// One tile: MT token rows x NB blocks (bs apart), all of K. Per group: each run's int32
// sums times its block's d into fp32, then wna16's epilogue. 8 bits: sum(q x) =
// sum((q - 128) x) + 128 sum(x), which offset -128 puts back.
template <int BITS, int MT, int NB, typename S>
void wna8_tile(const int8_t* xq, const float* xd, const float* xs, int64_t K, int64_t G,
               int64_t group, const uint8_t* w, const GroupScales<S>& gsc, int64_t b0,
               int64_t bs, float* out, int64_t ldo) {
  constexpr int L = NB * kVecs;
  const int64_t block_bytes = K * kRows * BITS / 8, nb = K / kActBlock, rc = run_cols(group);
  float yv[MT][L * vec::W];
  GLOWLM_UNROLL for (int m = 0; m < MT; ++m)
    GLOWLM_UNROLL for (int l = 0; l < L; ++l) vec::store(&yv[m][l * vec::W], vec::zero());
  for (int64_t g = 0; g < G; ++g) {
    VecF a[MT][L];
    GLOWLM_UNROLL for (int m = 0; m < MT; ++m)
      GLOWLM_UNROLL for (int l = 0; l < L; ++l) a[m][l] = vec::zero();
    GLOWLM_UNROLL for (int i = 0; i < NB; ++i) gsc.prefetch(b0 + i * bs, g + 2);
    for (int64_t k0 = g * group; k0 < (g + 1) * group; k0 += rc) {
      __m256i i32[MT][NB][2];
      GLOWLM_UNROLL for (int m = 0; m < MT; ++m)
        GLOWLM_UNROLL for (int i = 0; i < NB; ++i) i32[m][i][0] = i32[m][i][1] =
            _mm256_setzero_si256();
      if constexpr (BITS == 4)
        run4<MT, NB>(xq, K, w, block_bytes, b0, bs, k0, rc, i32);
      else
        run8<MT, NB>(xq, K, reinterpret_cast<const int8_t*>(w), block_bytes, b0, bs, k0, rc,
                     i32);
      GLOWLM_UNROLL for (int m = 0; m < MT; ++m) {
        const VecF d = vec::set1(xd[m * nb + k0 / kActBlock]);
        GLOWLM_UNROLL for (int i = 0; i < NB; ++i)
          add_rows32(i32[m][i][0], i32[m][i][1], d, &a[m][i * kVecs]);
      }
    }
    gsc.template apply<MT, L>(b0, bs, g, BITS == 8 ? -128.0f : 0.0f, a, xs, yv);
  }
  store_rows<MT, NB>(yv, b0, bs, out, ldo);
}
#if defined(__AVX512F__)
// Prefill's 4-bit tiles on AVX512_VNNI CPUs (Ice Lake, Zen 4/5, Sapphire Rapids): MT token
// rows x one block of 16 rows, 512-bit vpdpbusd (4 unsigned weight bytes times 4 signed
// activation bytes into one int32 lane). Its 4 bytes must be one row's 4 columns; a
// unit's 16-bit word r holds row r's columns k, k + 1 (low nibbles) and k + 2, k + 3
// (high), so widening the words to int32 lanes (vpmovzxwd) and one vpternlogd of the
// lane and the lane << 12 under 0x0F0F0F0F puts lane r's bytes in column order: 3
// instructions per unit give all 16 rows for every token row of the tile, and the sums
// come out in row order (no lane fix-up). Per unit and 8 token rows: 3 + 8 instructions,
// where the 256-bit run it replaces took 5 + 3 per row (5 + 24 for 8) and vpmaddubsw
// 3 + 6 per row. The sums are the same exact integers, so the results are identical.
// bench_quant w4 a8, Ice Lake guest, 2 threads, llama-1b shapes: see docs/kernels.md.
template <int MT, typename S>
__attribute__((target("avx512vnni"), noinline)) void wna8_tile4_vnni(
    const int8_t* xq, const float* xd, const float* xs, int64_t K, int64_t G, int64_t group,
    const uint8_t* w, const GroupScales<S>& gsc, int64_t b, float* out, int64_t ldo) {
  const int64_t nb = K / kActBlock, rc = run_cols(group);
  const uint8_t* wb = w + b * K * kRows / 2;
  const __m512i nibbles = _mm512_set1_epi32(0x0F0F0F0F);
  float yv[MT][kRows];
  GLOWLM_UNROLL for (int m = 0; m < MT; ++m) vec::store(yv[m], vec::zero());
  for (int64_t g = 0; g < G; ++g) {
    VecF a[MT][1];
    GLOWLM_UNROLL for (int m = 0; m < MT; ++m) a[m][0] = vec::zero();
    gsc.prefetch(b, g + 2);
    for (int64_t k0 = g * group; k0 < (g + 1) * group; k0 += rc) {
      __m512i acc[MT];
      GLOWLM_UNROLL for (int m = 0; m < MT; ++m) acc[m] = _mm512_setzero_si512();
      for (int64_t k = k0; k < k0 + rc; k += 4) {
        if ((k & 15) == 0)  // 16 columns: 128 bytes, 2 lines
          GLOWLM_UNROLL for (int j = 0; j < 2; ++j)
            vec::prefetch(wb + k * 8 + 64 * j + kWna8Ahead);
        const __m512i d = _mm512_cvtepu16_epi32(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + k * 8)));
        // (d | d << 12) & 0x0F0F0F0F: bytes lo(2r), lo(2r + 1), hi(2r), hi(2r + 1).
        const __m512i wv = _mm512_ternarylogic_epi32(d, _mm512_slli_epi32(d, 12), nibbles,
                                                     0xA8);
        GLOWLM_UNROLL for (int m = 0; m < MT; ++m) {
          int32_t xv;
          std::memcpy(&xv, xq + m * K + k, 4);
          acc[m] = _mm512_dpbusd_epi32(acc[m], wv, _mm512_set1_epi32(xv));
        }
      }
      GLOWLM_UNROLL for (int m = 0; m < MT; ++m)
        a[m][0] = vec::fmadd(vec::set1(xd[m * nb + k0 / kActBlock]),
                             {_mm512_cvtepi32_ps(acc[m])}, a[m][0]);
    }
    gsc.template apply<MT, 1>(b, 1, g, 0.0f, a, xs, yv);
  }
  store_rows<MT, 1>(yv, b, 1, out, ldo);
}
#endif

#endif

// Any ISA: the same integer sums in plain loops, one block, one token row at a time.
template <int BITS, typename S>
void wna8_block_generic(const int8_t* xq, const float* xd, const float* xs, int64_t K,
                        int64_t G, int64_t group, const uint8_t* w, const GroupScales<S>& gsc,
                        int64_t b, float* out) {
  const int64_t nb = K / kActBlock, rc = run_cols(group);
  const uint8_t* wb = w + b * K * kRows * BITS / 8;
  float yv[1][kRows];
  for (int r = 0; r < kRows; ++r) yv[0][r] = 0.f;
  for (int64_t g = 0; g < G; ++g) {
    float f[kRows] = {};
    for (int64_t k0 = g * group; k0 < (g + 1) * group; k0 += rc) {
      const float d = xd[k0 / kActBlock];
      for (int r = 0; r < kRows; ++r) {
        int32_t s = 0;
        for (int64_t k = k0; k < k0 + rc; ++k) {
          int32_t q;
          if constexpr (BITS == 4) {  // unit k / 4: byte 2r + (k % 2), high nibble if k % 4 >= 2
            const uint8_t byte = wb[(k / 4) * 2 * kRows + 2 * r + (k % 2)];
            q = (k % 4 >= 2) ? byte >> 4 : byte & 15;
          } else {  // [K/4][16][4] signed
            q = static_cast<int8_t>(wb[(k / 4) * 4 * kRows + 4 * r + k % 4]);
          }
          s += q * int32_t(xq[k]);
        }
        f[r] += d * static_cast<float>(s);
      }
    }
    VecF a[1][kVecs];
    for (int l = 0; l < kVecs; ++l) a[0][l] = vec::load(f + l * vec::W);
    gsc.template apply<1, kVecs>(b, 1, g, BITS == 8 ? -128.0f : 0.0f, a, xs, yv);
  }
  std::memcpy(out + b * kRows, yv[0], sizeof(float) * kRows);
}

template <int BITS, typename S>
void wna8_run(const int8_t* xq, const float* xd, const float* xs, int64_t M, int64_t K,
              int64_t G, int64_t group, const uint8_t* w, const GroupScales<S>& gsc,
              int64_t npad, float* out) {
  const int64_t blocks = npad / kRows, nb = K / kActBlock;
#if defined(GLOWLM_QUANT_X86)
  auto rows = [&](auto nbc, int64_t m0, int64_t mn, int64_t b0, int64_t bs) {
    constexpr int NB = decltype(nbc)::value;
    auto tile = [&](auto mtc, int64_t m) {
      constexpr int MT = decltype(mtc)::value;
      wna8_tile<BITS, MT, NB>(xq + m * K, xd + m * nb, xs + m * G, K, G, group, w, gsc, b0,
                              bs, out + m * npad, npad);
    };
    int64_t m = m0;
    const int64_t end = m0 + mn;
    if constexpr (NB == 1) {
#if defined(__AVX512F__)
      if constexpr (BITS == 4) {
        auto vnni = [&](auto mtc) {
          constexpr int MT = decltype(mtc)::value;
          wna8_tile4_vnni<MT>(xq + m * K, xd + m * nb, xs + m * G, K, G, group, w, gsc, b0,
                              out + m * npad, npad);
          m += MT;
        };
        if (has_vnni()) {
          while (m + 8 <= end) vnni(std::integral_constant<int, 8>{});
          if (m + 4 <= end) vnni(std::integral_constant<int, 4>{});
        }
      }
#endif
      for (; m + 4 <= end; m += 4) tile(std::integral_constant<int, 4>{}, m);
    }
    for (; m + 2 <= end; m += 2) tile(std::integral_constant<int, 2>{}, m);
    for (; m < end; ++m) tile(std::integral_constant<int, 1>{}, m);
  };
  // Decode (M <= 3): two far-apart streams per thread (the dense GEMV's finding), each
  // a run of adjacent blocks (stream_items); prefill: one block per item, token rows 4
  // at a time.
  if (M <= 3) stream_items<2>(M, blocks, rows);
  else block_items<1>(M, blocks, 1, rows);
#else
  parallel_chunks(blocks * M, [&](int64_t i) {
    const int64_t b = i % blocks, m = i / blocks;
    wna8_block_generic<BITS>(xq + m * K, xd + m * nb, xs + m * G, K, G, group, w, gsc, b,
                             out + m * npad);
  });
#endif
}

}  // namespace

at::Tensor wna8_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scales,
                       const at::Tensor& zs, int64_t bits, int64_t group_size, int64_t n,
                       const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2, "wna8_linear: x must be [M, K]");
  TORCH_CHECK(bits == 4 || bits == 8, "wna8_linear: bits must be 4 or 8");
  // 4 bits: wna16's uint8 nibble layout; 8 bits: W8A8's int8 layout (q - 128), never
  // wna16's uint8 column pairs, which would read as other values.
  TORCH_CHECK(weight.is_contiguous() &&
                  weight.scalar_type() == (bits == 4 ? at::kByte : at::kChar),
              "wna8_linear: weight must be contiguous uint8 (4 bits) or int8 (8 bits) in "
              "the prepared layout");
  const auto sdt = scales.scalar_type();
  const bool sym = zs.numel() == 0;
  TORCH_CHECK((sdt == at::kFloat || sdt == at::kHalf) && scales.is_contiguous() &&
                  scales.dim() == 3 && scales.size(2) == kRows &&
                  (sym || (zs.scalar_type() == sdt && zs.is_contiguous() &&
                           zs.sizes() == scales.sizes())),
              "wna8_linear: scales must be contiguous float32 or float16 [N/16, G, 16], and "
              "zs the same or empty (symmetric)");
  const int64_t M = x.size(0), K = x.size(1), G = scales.size(1), npad = scales.size(0) * kRows;
  TORCH_CHECK(K % kActBlock == 0 && G * group_size == K &&
                  (group_size == 16 || group_size % kActBlock == 0),
              "wna8_linear: K ", K, " must be a multiple of 32 in groups of 16 or of a "
              "multiple of 32 (", G, " groups of ", group_size, ")");
  TORCH_CHECK(npad % kRows == 0 && n <= npad && weight.numel() == npad * K * bits / 8,
              "wna8_linear: weight does not match N ", npad, " x K ", K);
  at::Tensor out = at::empty({M, npad}, x.options().dtype(at::kFloat));
  if (M == 0) return finish(out, n, bias, x.scalar_type());
  std::vector<int8_t> xq(static_cast<size_t>(M * K));
  std::vector<float> xd(static_cast<size_t>(M * (K / kActBlock))), xs(static_cast<size_t>(M * G));
  const at::Tensor xc = x.contiguous();  // read in its own dtype: no float copy per call
  if (xc.scalar_type() == at::kBFloat16)
    quantize_act_blocks(reinterpret_cast<const bf16*>(xc.data_ptr<at::BFloat16>()), M, K,
                        group_size, xq.data(), xd.data(), xs.data());
  else if (xc.scalar_type() == at::kHalf)
    quantize_act_blocks(reinterpret_cast<const fp16*>(xc.data_ptr<at::Half>()), M, K,
                        group_size, xq.data(), xd.data(), xs.data());
  else {
    const at::Tensor xf = xc.to(at::kFloat).contiguous();
    quantize_act_blocks(xf.data_ptr<float>(), M, K, group_size, xq.data(), xd.data(),
                        xs.data());
  }
  const uint8_t* w = static_cast<const uint8_t*>(weight.data_ptr());
  const float zero = static_cast<float>(1 << (bits - 1));
  auto run = [&](const auto* sp) {
    using S = std::remove_const_t<std::remove_pointer_t<decltype(sp)>>;
    const GroupScales<S> gsc{sp, sym ? nullptr : static_cast<const S*>(zs.data_ptr()), zero, G};
    if (bits == 4)
      wna8_run<4>(xq.data(), xd.data(), xs.data(), M, K, G, group_size, w, gsc, npad,
                  out.data_ptr<float>());
    else
      wna8_run<8>(xq.data(), xd.data(), xs.data(), M, K, G, group_size, w, gsc, npad,
                  out.data_ptr<float>());
  };
  if (sdt == at::kHalf) run(reinterpret_cast<const fp16*>(scales.data_ptr<at::Half>()));
  else run(scales.data_ptr<float>());
  return finish(out, n, bias, x.scalar_type());
}

}  // namespace glowlm

// The plugin's torch.ops namespace (-DGLOWLM_OPS_NAMESPACE in the shared tree's builds).
#ifndef GLOWLM_OPS_NAMESPACE
#define GLOWLM_OPS_NAMESPACE glowlm_x86
#endif
#define GLOWLM_QUANT_FRAGMENT(ns, m) TORCH_LIBRARY_FRAGMENT(ns, m)
#define GLOWLM_QUANT_IMPL(ns, k, m) TORCH_LIBRARY_IMPL(ns, k, m)

GLOWLM_QUANT_FRAGMENT(GLOWLM_OPS_NAMESPACE, m) {
  m.def("wna16_linear(Tensor x, Tensor weight, Tensor scales, Tensor zs, int bits,"
        " int group_size, int n, Tensor? bias) -> Tensor");
  m.def("w8a8_linear(Tensor x, Tensor weight, Tensor wscale, Tensor wsum, float input_scale,"
        " int input_zp, int n, Tensor? bias) -> Tensor");
  m.def("wna8_linear(Tensor x, Tensor weight, Tensor scales, Tensor zs, int bits,"
        " int group_size, int n, Tensor? bias) -> Tensor");
  m.def("quantize_rows(Tensor x, float input_scale, int input_zp) -> (Tensor, Tensor)");
}

GLOWLM_QUANT_IMPL(GLOWLM_OPS_NAMESPACE, CPU, m) {
  m.impl("wna16_linear", &glowlm::wna16_linear);
  m.impl("w8a8_linear", &glowlm::w8a8_linear);
  m.impl("wna8_linear", &glowlm::wna8_linear);
  m.impl("quantize_rows", &glowlm::quantize_rows);
}
