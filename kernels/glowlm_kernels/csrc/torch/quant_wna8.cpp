// Weight-only int4 / int8 weights x int8 activations per block of 32 columns: wna8_linear.
//
// The weight-only weights of quant_wna16.cpp with the activations quantized to int8 per
// block of 32 columns at run time (d = max|x| / 127 per block, q = nearbyint(x * 127 /
// max|x|), the W8A8 dynamic rule per block): what ggml does for every quantized GGUF type
// on every CPU (it multiplies Q4_0/Q4_1/K-quant blocks by Q8_0/Q8_1/Q8_K activations), so
// a GGUF model's reference implementation computes exactly these products, and the plain
// weight-only path (quant_wna16.cpp) is the more precise one. Why: without a bf16 or int8
// dot product the fp32 path converts every weight to fp32 and does one FMA per weight and
// token row (~36 instructions per 64 4-bit weights on AVX2), which is bound by those
// instructions, not by memory, at decode (Zen 2, AVX2, 2 threads, bench_quant
// gguf4/gguf8, M = 1: 4-bit 37-58 % of the read bandwidth, 8-bit 54-68 %; this path
// 68-97 % and 80-101 %). Here a 32-byte unit of 64 nibbles goes through vpmaddubsw
// (u8 x s8 -> int16 pairs) twice per token row: its low nibbles are (row r, columns k,
// k + 1) pairs and its high ones (r, k + 2, k + 3), the layout's own order. Sums are exact
// integers: one column's product is at most 15 * 127, so 16 columns fit int16 (30 480);
// every 16 columns go to int32, every 32 to fp32 with the block's d. 8-bit weights use
// W8A8's layout ([N/16][K/4][16][4], signed q - 128: prepared for this path): vpmaddubsw
// on |w| and sign(x, w), then vpmaddwd to int32 (a pair is at most 2 * 128 * 127).
// The epilogue is wna16's: y += s * sum(q x^) - zero * s * sum(x^), sum(x^) = d * sum(q_x).
#include "torch/quant_common.h"

namespace glowlm {
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
