// AVX2 + FMA + F16C implementation of vec.h (8 floats per register).
#pragma once

#include <immintrin.h>

namespace glowlm::vec {

constexpr int W = 8;
constexpr const char* kIsa = "avx2";
// GEMV register tile: kGemvMR token rows x 4 weight rows of accumulators (16 ymm total).
constexpr int kGemvMR = 2;
// GEMM register tile (gemm.cpp): kGemmNR weight rows x 2 vectors of token rows, i.e.
// 12 accumulators + 2 activation vectors + 1 broadcast of the 16 registers.
constexpr int kGemmNR = 6;

struct VecF {
  __m256 v;
};

inline VecF zero() { return {_mm256_setzero_ps()}; }
inline VecF set1(float x) { return {_mm256_set1_ps(x)}; }
inline VecF broadcast(const float* p) { return {_mm256_broadcast_ss(p)}; }
inline VecF load(const float* p) { return {_mm256_loadu_ps(p)}; }
inline VecF load(const bf16* p) {
  __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return {_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))};
}
inline VecF load(const fp16* p) {
  return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))};
}
// 8 fp8 bytes -> fp16 bits -> fp32 (types.h: the E4M3 bits shifted are 2^-8 x value).
inline VecF load(const fp8e5m2* p) {
  __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  return {_mm256_cvtph_ps(_mm_slli_epi16(b, 8))};
}
// E4M3 as in vec_avx512.h: shift left 7, then carry the sign from bit 14 to bit 15.
inline VecF load(const fp8e4m3* p) {
  __m128i t = _mm_slli_epi16(
      _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))), 7);
  __m128i h = _mm_add_epi16(t, _mm_and_si128(t, _mm_set1_epi16(0x4000)));
  return {_mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(256.0f))};
}
// 8 int8 values (an int8 KV cache row) -> fp32.
inline VecF load(const int8_t* p) {
  return {_mm256_cvtepi32_ps(
      _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))))};
}
inline void store(float* p, VecF a) { _mm256_storeu_ps(p, a.v); }
inline void store(bf16* p, VecF a) {
  // Round to nearest even: add 0x7fff + lsb of the kept half, then keep the top 16 bits.
  __m256i i = _mm256_castps_si256(a.v);
  __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(i, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(i, _mm256_set1_epi32(0x7fff)),
                                                 lsb), 16);
  // NaN stays NaN (quiet bit set) instead of rounding into infinity.
  __m256 isnan = _mm256_cmp_ps(a.v, a.v, _CMP_UNORD_Q);
  r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7fc0), _mm256_castps_si256(isnan));
  __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
}
inline void store(fp16* p, VecF a) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(a.v, _MM_FROUND_TO_NEAREST_INT));
}

inline VecF add(VecF a, VecF b) { return {_mm256_add_ps(a.v, b.v)}; }
inline VecF sub(VecF a, VecF b) { return {_mm256_sub_ps(a.v, b.v)}; }
inline VecF mul(VecF a, VecF b) { return {_mm256_mul_ps(a.v, b.v)}; }
inline VecF div(VecF a, VecF b) { return {_mm256_div_ps(a.v, b.v)}; }
inline VecF max(VecF a, VecF b) { return {_mm256_max_ps(a.v, b.v)}; }
inline VecF fmadd(VecF a, VecF b, VecF c) { return {_mm256_fmadd_ps(a.v, b.v, c.v)}; }

inline float reduce_add(VecF a) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a.v), _mm256_extractf128_ps(a.v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
// Lane j of the result is reduce_add(a[j]), for the W vectors a[0..W): W dot products
// finished at once (hadd tree) instead of W horizontal reductions.
inline VecF transpose_sum(const VecF* a) {
  __m256 t0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0].v, a[1].v), _mm256_hadd_ps(a[2].v, a[3].v));
  __m256 t1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4].v, a[5].v), _mm256_hadd_ps(a[6].v, a[7].v));
  return {_mm256_add_ps(_mm256_permute2f128_ps(t0, t1, 0x20),
                        _mm256_permute2f128_ps(t0, t1, 0x31))};
}

inline float reduce_max(VecF a) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(a.v), _mm256_extractf128_ps(a.v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// exp(x) for fp32: range reduction x = n ln2 + r, |r| <= ln2/2, a 6-coefficient polynomial
// (Cephes expf coefficients, ~1 ulp), then scale by 2^n through the exponent bits.
inline VecF exp(VecF x) {
  __m256 v = _mm256_min_ps(_mm256_max_ps(x.v, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.7f));
  __m256 n = _mm256_round_ps(_mm256_mul_ps(v, _mm256_set1_ps(1.44269504088896341f)),
                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), v);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)),
                                23);
  __m256 res = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
  // Inputs below the clamp underflow to exactly 0 (masked softmax entries rely on it).
  __m256 tiny = _mm256_cmp_ps(x.v, _mm256_set1_ps(-87.3f), _CMP_LT_OQ);
  return {_mm256_andnot_ps(tiny, res)};
}

}  // namespace glowlm::vec
