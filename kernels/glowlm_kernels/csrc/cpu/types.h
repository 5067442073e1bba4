// Storage types of the kernels: fp32, bf16 and fp16, with exact scalar conversions.
//
// The algorithms (cpu/*.h) never include torch: they compile for a C++ test driver run
// under qemu on other CPU families, and for any future binding. `bf16` and `fp16` are
// 16-bit patterns with the layout of c10::BFloat16 / c10::Half (one uint16_t), so the
// torch binding passes tensor storage to them by pointer cast. Conversions round to
// nearest even, as torch does; fp16 handles subnormals, infinities and NaN in software
// (these scalar paths only serve loop tails; the vector headers convert in registers).
#pragma once

#include <cstdint>
#include <cstring>

namespace glowlm {

struct bf16 {
  uint16_t x;
};
struct fp16 {
  uint16_t x;
};
// 8-bit floats of the KV cache (--kv-cache-dtype fp8 / fp8_e5m2), the layouts of
// c10::Float8_e4m3fn (bias 7, no infinities, 448 the largest) and c10::Float8_e5m2
// (fp16's top byte). Only loads widen them in the kernels: the cache is written by
// torch's cast, which saturates and rounds to nearest even.
struct fp8e4m3 {
  uint8_t x;
};
struct fp8e5m2 {
  uint8_t x;
};

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}
inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

namespace vec {

inline float to_float(float x) { return x; }
inline float to_float(bf16 x) { return bits_float(static_cast<uint32_t>(x.x) << 16); }
inline float to_float(fp16 h) {
  const uint32_t sign = static_cast<uint32_t>(h.x & 0x8000u) << 16;
  const uint32_t exp = (h.x >> 10) & 0x1fu, mant = h.x & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: mant * 2^-24, exact in fp32
    const float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return bits_float(float_bits(v) | sign);
  }
  if (exp == 31) return bits_float(sign | 0x7f800000u | (mant << 13));  // inf / NaN
  return bits_float(sign | ((exp + 112) << 23) | (mant << 13));
}

// E5M2 is fp16 with the low byte dropped; E4M3's exponent and mantissa bits, shifted
// into fp16's places, are an fp16 of 2^-8 times the value (bias 15 against 7; E4M3's
// subnormals land on fp16 normals or subnormals of the same scale), so the vector loads
// widen both through the fp16 conversion the CPU has.
inline float to_float(fp8e5m2 v) { return to_float(fp16{static_cast<uint16_t>(v.x << 8)}); }
inline float to_float(fp8e4m3 v) {
  const uint16_t h = static_cast<uint16_t>(((v.x & 0x80u) << 8) | ((v.x & 0x7fu) << 7));
  return to_float(fp16{h}) * 256.0f;
}

template <typename T>
inline T from_float(float x);

template <>
inline float from_float<float>(float x) { return x; }

template <>
inline bf16 from_float<bf16>(float f) {
  const uint32_t u = float_bits(f);
  if (f != f) return {0x7fc0};  // NaN stays a quiet NaN
  return {static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)};
}

template <>
inline fp16 from_float<fp16>(float f) {
  uint32_t u = float_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  u &= 0x7fffffffu;
  if (u >= 0x47800000u)  // >= 65536 (or inf/NaN): inf, or a quiet NaN
    return {static_cast<uint16_t>(sign | (u > 0x7f800000u ? 0x7e00u : 0x7c00u))};
  if (u < 0x38800000u) {  // below 2^-14: a subnormal or zero half
    // Adding 0.5 aligns the half's subnormal unit to the float's last bit: the FPU
    // rounds to nearest even, and the mantissa bits are the half's.
    const float r = bits_float(u) + 0.5f;
    return {static_cast<uint16_t>(sign | (float_bits(r) - 0x3f000000u))};
  }
  const uint32_t odd = (u >> 13) & 1u;  // round to nearest even on the 13 dropped bits
  u += 0xc8000fffu + odd;               // rebias the exponent (-112 << 23) and round
  return {static_cast<uint16_t>(sign | (u >> 13))};
}

}  // namespace vec
}  // namespace glowlm
