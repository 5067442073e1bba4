// What the quantized linear kernels share: the 16-row weight blocks, the per-group
// dequantization epilogue, the output stores, the work split over threads, the output
// conversion, the activation quantization of the int8 paths and the VNNI check.
//
// One file per tile family includes it:
//   quant_wna16.cpp  weight-only int4 / int8 with fp32 or bf16 activations (W4A16,
//                    W8A16: AWQ, GPTQ, compressed-tensors, GGUF Q4_0 / Q4_1 / Q8_0 ...);
//   quant_wna8.cpp   the same weights with int8 activations per 32 columns (wna8:
//                    GGUF's own arithmetic, the fast weight-only path without bf16 dots);
//   quant_w8a8.cpp   int8 x int8 (W8A8) and the int8 activations of another int8 GEMM;
// and quant_registration.cpp registers their ops (schemas in quant_ops.h).
//
// The weights are read in a layout prepared once at load (glowlm_kernels/quant.py), so
// that one contiguous load feeds one register of 16 output rows; each family's file has
// its layout and why. Everything here is in an unnamed namespace, as it was in the one
// file the families came from: each translation unit keeps its own internal copy, so the
// module exports the same symbols (the ops' entry points) and nothing more.
#pragma once

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

#include "torch/quant_ops.h"

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

// The first n of npad fp32 columns (+ bias) in the activations' dtype, in one pass.
inline at::Tensor finish(const at::Tensor& acc, int64_t n,
                         const std::optional<at::Tensor>& bias, at::ScalarType dtype) {
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

// The int8 activations' quantization (W8A8 per row, wna8 per block of 32 columns).
//
// max |x[k]| (0 for an empty row; NaNs are skipped, as std::max(amax, NaN) keeps amax).
inline float abs_max(const float* x, int64_t K) {
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
inline void quantize_values(const float* x, int64_t K, float inv, float zp, float lo,
                            uint8_t* out) {
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

#if defined(GLOWLM_QUANT_X86) && defined(__AVX512F__)
// Whether this CPU has AVX512_VNNI (vpdpbusd): the W8A8 tiles and wna8's 4-bit prefill.
inline bool has_vnni() {
  static const bool yes = __builtin_cpu_supports("avx512vnni");
  return yes;
}
#endif

}  // namespace
}  // namespace glowlm
