// AVX-512 (F/BW/VL) implementation of vec.h (16 floats per register).
#pragma once

#include <immintrin.h>

namespace glowlm::vec {

constexpr int W = 16;
#if defined(__AVX512BF16__)
constexpr const char* kIsa = "avx512-bf16";
#else
constexpr const char* kIsa = "avx512";
#endif
// GEMV register tile: kGemvMR token rows x 4 weight rows (32 zmm registers available).
constexpr int kGemvMR = 4;
// GEMM register tile (gemm.cpp): kGemmNR weight rows x 2 vectors of token rows, i.e.
// 16 accumulators + 2 activation vectors + 1 broadcast of the 32 registers (12 rows
// would fill more zmm registers but ran out of general registers for the row addresses).
constexpr int kGemmNR = 8;

struct VecF {
  __m512 v;
};

inline VecF zero() { return {_mm512_setzero_ps()}; }
inline VecF set1(float x) { return {_mm512_set1_ps(x)}; }
inline VecF broadcast(const float* p) { return {_mm512_set1_ps(*p)}; }
inline VecF load(const float* p) { return {_mm512_loadu_ps(p)}; }
inline VecF load(const bf16* p) {
  __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return {_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))};
}
inline VecF load(const fp16* p) {
  return {_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))};
}
// 16 fp8 bytes -> fp16 bits -> fp32 (types.h: the E4M3 bits shifted are 2^-8 x value).
inline VecF load(const fp8e5m2* p) {
  __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return {_mm512_cvtph_ps(_mm256_slli_epi16(b, 8))};
}
// E4M3: the byte shifted left 7 puts exponent and mantissa in fp16's places and the
// sign on bit 14; adding bit 14 to itself carries it to bit 15 (the byte is < 0x100, so
// bit 15 was clear): three integer ops rather than two masks, two shifts and an or.
inline VecF load(const fp8e4m3* p) {
  __m256i t = _mm256_slli_epi16(
      _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 7);
  __m256i h = _mm256_add_epi16(t, _mm256_and_si256(t, _mm256_set1_epi16(0x4000)));
  return {_mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(256.0f))};
}
// 16 int8 values (an int8 KV cache row) -> fp32.
inline VecF load(const int8_t* p) {
  return {_mm512_cvtepi32_ps(
      _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))))};
}
inline void store(float* p, VecF a) { _mm512_storeu_ps(p, a.v); }
inline void store(bf16* p, VecF a) {
  __m512i i = _mm512_castps_si512(a.v);
  __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(i, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(i, _mm512_set1_epi32(0x7fff)),
                                                 lsb), 16);
  __mmask16 isnan = _mm512_cmp_ps_mask(a.v, a.v, _CMP_UNORD_Q);
  r = _mm512_mask_mov_epi32(r, isnan, _mm512_set1_epi32(0x7fc0));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(r));
}
inline void store(fp16* p, VecF a) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                      _mm512_cvtps_ph(a.v, _MM_FROUND_TO_NEAREST_INT));
}

inline VecF add(VecF a, VecF b) { return {_mm512_add_ps(a.v, b.v)}; }
inline VecF sub(VecF a, VecF b) { return {_mm512_sub_ps(a.v, b.v)}; }
inline VecF mul(VecF a, VecF b) { return {_mm512_mul_ps(a.v, b.v)}; }
inline VecF div(VecF a, VecF b) { return {_mm512_div_ps(a.v, b.v)}; }
inline VecF max(VecF a, VecF b) { return {_mm512_max_ps(a.v, b.v)}; }
inline VecF fmadd(VecF a, VecF b, VecF c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }

inline float reduce_add(VecF a) { return _mm512_reduce_add_ps(a.v); }
inline float reduce_max(VecF a) { return _mm512_reduce_max_ps(a.v); }
// Lane j of the result is reduce_add(a[j]), for the W vectors a[0..W).
inline VecF transpose_sum(const VecF* a) {
  alignas(64) float out[16];
  for (int j = 0; j < 16; ++j) out[j] = reduce_add(a[j]);
  return {_mm512_load_ps(out)};
}

// Same algorithm and coefficients as the AVX2 exp (see vec_avx2.h).
inline VecF exp(VecF x) {
  __m512 v = _mm512_min_ps(_mm512_max_ps(x.v, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.7f));
  __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(v, _mm512_set1_ps(1.44269504088896341f)),
                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), v);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)),
                                23);
  __m512 res = _mm512_mul_ps(p, _mm512_castsi512_ps(e));
  __mmask16 tiny = _mm512_cmp_ps_mask(x.v, _mm512_set1_ps(-87.3f), _CMP_LT_OQ);
  return {_mm512_maskz_mov_ps(static_cast<__mmask16>(~tiny), res)};
}

#if defined(__AVX512BF16__)
// Pairwise bf16 dot products (vec.h GLOWLM_VEC_BF16DOT): a VecBF holds W pairs of bf16,
// and dot2 adds a[2i] * b[2i] + a[2i + 1] * b[2i + 1] to fp32 lane i in one vdpbf16ps
// (products exact in fp32, so bf16 activations times small integers lose nothing).
#define GLOWLM_VEC_BF16DOT 1

struct VecBF {
  __m512i v;
};

inline VecF dot2(VecF acc, VecBF a, VecBF b) {
  return {_mm512_dpbf16_ps(acc.v, (__m512bh)a.v, (__m512bh)b.v)};
}
// 2W bf16 as stored, p[2i], p[2i + 1] in lane i: dot2's operand straight from memory
// (the dense bf16 GEMV's weights and activations, cpu/gemv.h).
inline VecBF load_pairs(const bf16* p) { return {_mm512_loadu_si512(p)}; }
// The pair p[0], p[1] in every lane.
inline VecBF broadcast_pair(const bf16* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof(v));
  return {_mm512_set1_epi32(v)};
}
// 2W bytes of 4-bit values, byte 2i + j holding (low nibble, high nibble) = (a, b):
// lo gets the a's, hi the b's, each byte's value in 16-bit lane 2i + j as the bf16 of
// 128 + value. Or-ing a nibble into the mantissa of bf16 128.0 (0x4300) makes 128 + q
// exactly, so the unpack is three logic ops and no conversion; callers subtract
// 128 * sum(x) (folded into the zero point).
inline void nibble_units(const uint8_t* p, VecBF& lo, VecBF& hi) {
  const __m512i w = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  const __m512i magic = _mm512_set1_epi16(0x4300);
  // (w & 0x000f) | 0x4300: vpternlog's truth table 0xea is (A & B) | C.
  lo = {_mm512_ternarylogic_epi32(w, _mm512_set1_epi16(0x000f), magic, 0xea)};
  hi = {_mm512_or_si512(_mm512_srli_epi16(w, 4), magic)};
}
#endif

}  // namespace glowlm::vec
