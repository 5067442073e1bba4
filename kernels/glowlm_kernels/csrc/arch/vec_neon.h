// Arm NEON (AArch64 Advanced SIMD) implementation of vec.h: 8 floats as two q registers.
//
// Eight lanes rather than four keep the kernels' tile shapes and the head/block-size
// rules of the 8-lane x86 AVX2 build (32 q registers hold the AVX2 tiles twice over).
// fp16 converts with FCVTL/FCVTN (every AArch64 CPU has them); bf16 loads are a shift
// (bf16 is the top half of an fp32), and with FEAT_BF16 (-march=armv8.6-a+bf16:
// Neoverse V1/V2/N2, Graviton 3/4) bf16 stores use BFCVTN, else the integer
// round-to-nearest-even of the portable header, and the optional pairwise bf16 dot
// product of vec.h (GLOWLM_VEC_BF16DOT) is BFDOT (below). FMLA fuses every fmadd.
#pragma once

#include <arm_neon.h>

namespace glowlm::vec {

constexpr int W = 8;
#if defined(__ARM_FEATURE_BF16_VECTOR_ARITHMETIC)
constexpr const char* kIsa = "neon-bf16";
#else
constexpr const char* kIsa = "neon";
#endif
constexpr int kGemvMR = 2;
constexpr int kGemmNR = 6;

struct VecF {
  float32x4_t lo, hi;
};

inline VecF zero() { return {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)}; }
inline VecF set1(float x) { return {vdupq_n_f32(x), vdupq_n_f32(x)}; }
inline VecF broadcast(const float* p) { return set1(*p); }
inline VecF load(const float* p) { return {vld1q_f32(p), vld1q_f32(p + 4)}; }
inline VecF load(const bf16* p) {
  const uint16x8_t h = vld1q_u16(reinterpret_cast<const uint16_t*>(p));
  return {vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(h), 16)),
          vreinterpretq_f32_u32(vshll_n_u16(vget_high_u16(h), 16))};
}
inline VecF load(const fp16* p) {
  const float16x8_t h = vreinterpretq_f16_u16(vld1q_u16(reinterpret_cast<const uint16_t*>(p)));
  return {vcvt_f32_f16(vget_low_f16(h)), vcvt_high_f32_f16(h)};
}
// 8 fp8 bytes -> fp16 bits -> fp32 (types.h: the E4M3 bits shifted are 2^-8 x value).
inline VecF load(const fp8e5m2* p) {
  const uint16x8_t b = vmovl_u8(vld1_u8(reinterpret_cast<const uint8_t*>(p)));
  const float16x8_t h = vreinterpretq_f16_u16(vshlq_n_u16(b, 8));
  return {vcvt_f32_f16(vget_low_f16(h)), vcvt_high_f32_f16(h)};
}
inline VecF load(const fp8e4m3* p) {
  const uint16x8_t b = vmovl_u8(vld1_u8(reinterpret_cast<const uint8_t*>(p)));
  const uint16x8_t bits = vorrq_u16(vshlq_n_u16(vandq_u16(b, vdupq_n_u16(0x80)), 8),
                                    vshlq_n_u16(vandq_u16(b, vdupq_n_u16(0x7f)), 7));
  const float16x8_t h = vreinterpretq_f16_u16(bits);
  const float32x4_t k = vdupq_n_f32(256.0f);
  return {vmulq_f32(vcvt_f32_f16(vget_low_f16(h)), k), vmulq_f32(vcvt_high_f32_f16(h), k)};
}
// 8 int8 values (an int8 KV cache row) -> fp32.
inline VecF load(const int8_t* p) {
  const int16x8_t h = vmovl_s8(vld1_s8(p));
  return {vcvtq_f32_s32(vmovl_s16(vget_low_s16(h))), vcvtq_f32_s32(vmovl_high_s16(h))};
}
inline void store(float* p, VecF a) {
  vst1q_f32(p, a.lo);
  vst1q_f32(p + 4, a.hi);
}

#if defined(__ARM_FEATURE_BF16_VECTOR_ARITHMETIC)
inline void store(bf16* p, VecF a) {  // BFCVTN/BFCVTN2: round to nearest even in hardware
  const bfloat16x8_t h = vcvtq_high_bf16_f32(vcvtq_low_bf16_f32(a.lo), a.hi);
  vst1q_u16(reinterpret_cast<uint16_t*>(p), vreinterpretq_u16_bf16(h));
}
#else
inline uint16x4_t round_bf16(float32x4_t v) {
  // Round to nearest even through the integer bits; NaN becomes the quiet NaN 0x7fc0.
  const uint32x4_t i = vreinterpretq_u32_f32(v);
  const uint32x4_t lsb = vandq_u32(vshrq_n_u32(i, 16), vdupq_n_u32(1));
  uint32x4_t r = vshrq_n_u32(vaddq_u32(vaddq_u32(i, vdupq_n_u32(0x7fff)), lsb), 16);
  r = vbslq_u32(vceqq_f32(v, v), r, vdupq_n_u32(0x7fc0));
  return vmovn_u32(r);
}
inline void store(bf16* p, VecF a) {
  vst1q_u16(reinterpret_cast<uint16_t*>(p), vcombine_u16(round_bf16(a.lo), round_bf16(a.hi)));
}
#endif

inline void store(fp16* p, VecF a) {  // FCVTN: round to nearest even (the default FPCR mode)
  const float16x8_t h = vcvt_high_f16_f32(vcvt_f16_f32(a.lo), a.hi);
  vst1q_u16(reinterpret_cast<uint16_t*>(p), vreinterpretq_u16_f16(h));
}

inline VecF add(VecF a, VecF b) { return {vaddq_f32(a.lo, b.lo), vaddq_f32(a.hi, b.hi)}; }
inline VecF sub(VecF a, VecF b) { return {vsubq_f32(a.lo, b.lo), vsubq_f32(a.hi, b.hi)}; }
inline VecF mul(VecF a, VecF b) { return {vmulq_f32(a.lo, b.lo), vmulq_f32(a.hi, b.hi)}; }
inline VecF div(VecF a, VecF b) { return {vdivq_f32(a.lo, b.lo), vdivq_f32(a.hi, b.hi)}; }
// FMAX returns NaN when either input is NaN, as x86 max(0, x) keeps a NaN x.
inline VecF max(VecF a, VecF b) { return {vmaxq_f32(a.lo, b.lo), vmaxq_f32(a.hi, b.hi)}; }
inline VecF fmadd(VecF a, VecF b, VecF c) {
  return {vfmaq_f32(c.lo, a.lo, b.lo), vfmaq_f32(c.hi, a.hi, b.hi)};
}

inline float reduce_add(VecF a) { return vaddvq_f32(vaddq_f32(a.lo, a.hi)); }
inline float reduce_max(VecF a) { return vmaxvq_f32(vmaxq_f32(a.lo, a.hi)); }
// Lane j of the result is reduce_add(a[j]), for the W vectors a[0..W).
inline VecF transpose_sum(const VecF* a) {
  float32x4_t s[W];
  for (int j = 0; j < W; ++j) s[j] = vaddq_f32(a[j].lo, a[j].hi);
  // Pairwise adds of four row sums give their four horizontal sums in lane order.
  const float32x4_t lo = vpaddq_f32(vpaddq_f32(s[0], s[1]), vpaddq_f32(s[2], s[3]));
  const float32x4_t hi = vpaddq_f32(vpaddq_f32(s[4], s[5]), vpaddq_f32(s[6], s[7]));
  return {lo, hi};
}

// exp(x): the same range reduction and Cephes polynomial as the x86 headers.
inline float32x4_t exp4(float32x4_t x) {
  const float32x4_t lo = vdupq_n_f32(-87.3f);
  float32x4_t v = vminq_f32(vmaxq_f32(x, lo), vdupq_n_f32(88.7f));
  const float32x4_t n = vrndnq_f32(vmulq_f32(v, vdupq_n_f32(1.44269504088896341f)));
  float32x4_t r = vfmsq_f32(v, n, vdupq_n_f32(0.693359375f));
  r = vfmsq_f32(r, n, vdupq_n_f32(-2.12194440e-4f));
  float32x4_t p = vdupq_n_f32(1.9875691500e-4f);
  p = vfmaq_f32(vdupq_n_f32(1.3981999507e-3f), p, r);
  p = vfmaq_f32(vdupq_n_f32(8.3334519073e-3f), p, r);
  p = vfmaq_f32(vdupq_n_f32(4.1665795894e-2f), p, r);
  p = vfmaq_f32(vdupq_n_f32(1.6666665459e-1f), p, r);
  p = vfmaq_f32(vdupq_n_f32(5.0000001201e-1f), p, r);
  p = vfmaq_f32(vaddq_f32(r, vdupq_n_f32(1.0f)), p, vmulq_f32(r, r));
  const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
  const float32x4_t res = vmulq_f32(p, vreinterpretq_f32_s32(e));
  // Inputs below the clamp underflow to exactly 0 (masked softmax entries rely on it).
  return vbslq_f32(vcltq_f32(x, lo), vdupq_n_f32(0.0f), res);
}
inline VecF exp(VecF x) { return {exp4(x.lo), exp4(x.hi)}; }

#if defined(__ARM_FEATURE_BF16_VECTOR_ARITHMETIC) && !defined(__ARM_BIG_ENDIAN)
// Pairwise bf16 dot products (vec.h GLOWLM_VEC_BF16DOT), the contract of vec_avx512.h's
// vdpbf16ps with BFDOT (FEAT_BF16): a VecBF holds W = 8 pairs of bf16 as two q registers
// (lo: the pairs of fp32 lanes 0-3, hi: lanes 4-7, as VecF), and dot2 adds
// a[2i] * b[2i] + a[2i + 1] * b[2i + 1] to fp32 lane i, one BFDOT per q register.
//
// Rounding. Unlike vdpbf16ps (one round-to-nearest-even per accumulation), BFDOT
// without FEAT_EBF16 (or with FPCR.EBF = 0, Linux's default) rounds each product, their
// sum, and the accumulation separately, with the non-IEEE round-to-odd mode, and
// flushes denormal inputs and results to zero (Arm ARM, BFDOT (vector)). For the one
// user, the 4-bit kernel (quant_wna16.cpp), the products are (128 + q) * x with two
// bf16 operands of 8 significant bits each, so every product is exact in fp32 and its
// rounding never happens; what remains is two fp32 roundings per dot2 of at most one
// ulp each (round-to-odd) instead of half an ulp, i.e. twice x86's error bound on the
// fp32 partial sums (2^-23 instead of 2^-24 relative per step; the sums carry the
// 128 * sum(x) offset on both ISAs). For the contract's shapes and group sizes that stays
// well below the one bf16 output rounding (2^-8) the contract allows; tested under qemu
// against core's reference (kernels/tests/test_cross_kernels.py). Flushed inputs are bf16 activations below
// 2^-126, whose products are below 2^-118: nothing a result can show.
// Big-endian AArch64 would number the 16-bit lanes of the byte loads differently; it
// keeps the fp32 path.
#define GLOWLM_VEC_BF16DOT 1

struct VecBF {
  bfloat16x8_t lo, hi;
};

inline VecF dot2(VecF acc, VecBF a, VecBF b) {
  return {vbfdotq_f32(acc.lo, a.lo, b.lo), vbfdotq_f32(acc.hi, a.hi, b.hi)};
}
// 2W = 16 bf16 as stored, p[2i], p[2i + 1] in lane i (lo: p[0..8), hi: p[8..16)):
// dot2's operand straight from memory (the dense bf16 GEMV, cpu/gemv.h).
inline VecBF load_pairs(const bf16* p) {
  const bfloat16_t* q = reinterpret_cast<const bfloat16_t*>(p);
  return {vld1q_bf16(q), vld1q_bf16(q + 8)};
}
// The pair p[0], p[1] in every lane.
inline VecBF broadcast_pair(const bf16* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof(v));
  const bfloat16x8_t b = vreinterpretq_bf16_u32(vdupq_n_u32(v));
  return {b, b};
}
// 2W = 16 bytes of 4-bit values, byte 2i + j holding (low nibble, high nibble) = (a, b):
// lo gets the a's, hi the b's, byte 2i + j's value in 16-bit lane 2i + j as the bf16 of
// 128 + value (bf16 128.0 is 0x4300; its mantissa's low 4 bits count units of 1). The
// nibbles are split on bytes (AND, USHR) and each is zipped with the byte 0x43 above it
// (ZIP1/ZIP2 make 16-bit lanes 0x43 << 8 | nibble): six instructions per 32 weights, no
// conversion; callers subtract 128 * sum(x) (folded into the zero point).
inline void nibble_units(const uint8_t* p, VecBF& lo, VecBF& hi) {
  const uint8x16_t b = vld1q_u8(p);
  const uint8x16_t magic = vdupq_n_u8(0x43);
  const uint8x16_t l = vandq_u8(b, vdupq_n_u8(0x0f));
  const uint8x16_t h = vshrq_n_u8(b, 4);
  lo = {vreinterpretq_bf16_u8(vzip1q_u8(l, magic)), vreinterpretq_bf16_u8(vzip2q_u8(l, magic))};
  hi = {vreinterpretq_bf16_u8(vzip1q_u8(h, magic)), vreinterpretq_bf16_u8(vzip2q_u8(h, magic))};
}
#endif

}  // namespace glowlm::vec
