// Portable implementation of vec.h: GCC/Clang vector extensions, no intrinsics.
//
// Why it exists: it is the proof that the kernels depend on vec.h's names alone (the
// whole contract suite runs against it: `GLOWLM_KERNEL_ISA=portable`), the starting
// point of a port, and the s390x header: GCC compiles these vector types to the z14
// vector facility (VXE, -march=z14) and z15's VXE2 (-march=z15) directly, 8 floats as
// two 128-bit registers (32 of them). The same file compiles for any target the
// compiler knows (SSE2 on baseline x86-64, NEON on aarch64); a port replaces the slow
// spots with the ISA's intrinsics (fp16 conversion here is scalar, and a*b+c is fused
// only where the compiler contracts it). The header works on integers, not bytes, so
// its bf16 bit tricks hold on big-endian s390x. x86 CPUs use vec_avx2.h or
// vec_avx512.h; Arm vec_neon.h.
#pragma once

namespace glowlm::vec {

constexpr int W = 8;
constexpr const char* kIsa = "portable";
// The AVX2 tile shapes: 8 floats are two 128-bit registers on NEON/VXE (32 of them).
constexpr int kGemvMR = 2;
constexpr int kGemmNR = 6;

typedef float F8 __attribute__((vector_size(32)));
typedef int32_t I8 __attribute__((vector_size(32)));
typedef uint32_t U8 __attribute__((vector_size(32)));
typedef uint16_t H8 __attribute__((vector_size(16)));

struct VecF {
  F8 v;
};

inline VecF zero() { return {F8{}}; }
inline VecF set1(float x) { return {F8{} + x}; }
inline VecF broadcast(const float* p) { return set1(*p); }
inline VecF load(const float* p) {
  VecF a;
  std::memcpy(&a.v, p, sizeof(F8));
  return a;
}
inline VecF load(const bf16* p) {
  H8 h;
  std::memcpy(&h, p, sizeof(H8));
  return {reinterpret_cast<F8>(__builtin_convertvector(h, U8) << 16)};
}
inline VecF load(const fp16* p) {
  VecF a;
  for (int i = 0; i < W; ++i) a.v[i] = to_float(p[i]);
  return a;
}
inline VecF load(const fp8e5m2* p) {
  VecF a;
  for (int i = 0; i < W; ++i) a.v[i] = to_float(p[i]);
  return a;
}
inline VecF load(const fp8e4m3* p) {
  VecF a;
  for (int i = 0; i < W; ++i) a.v[i] = to_float(p[i]);
  return a;
}
inline VecF load(const int8_t* p) {  // an int8 KV cache row
  VecF a;
  for (int i = 0; i < W; ++i) a.v[i] = static_cast<float>(p[i]);
  return a;
}
inline void store(float* p, VecF a) { std::memcpy(p, &a.v, sizeof(F8)); }
inline void store(bf16* p, VecF a) {
  // Round to nearest even through the integer bits; NaN stays a quiet NaN.
  const U8 i = reinterpret_cast<U8>(a.v);
  const U8 rounded = (i + 0x7fffu + ((i >> 16) & 1u)) >> 16;
  const U8 r = a.v != a.v ? U8{} + 0x7fc0u : rounded;
  const H8 h = __builtin_convertvector(r, H8);
  std::memcpy(p, &h, sizeof(H8));
}
inline void store(fp16* p, VecF a) {
  for (int i = 0; i < W; ++i) p[i] = from_float<fp16>(a.v[i]);  // round to nearest even
}

inline VecF add(VecF a, VecF b) { return {a.v + b.v}; }
inline VecF sub(VecF a, VecF b) { return {a.v - b.v}; }
inline VecF mul(VecF a, VecF b) { return {a.v * b.v}; }
inline VecF div(VecF a, VecF b) { return {a.v / b.v}; }
inline VecF max(VecF a, VecF b) { return {a.v > b.v ? a.v : b.v}; }
inline VecF fmadd(VecF a, VecF b, VecF c) { return {a.v * b.v + c.v}; }

inline float reduce_add(VecF a) {
  return ((a.v[0] + a.v[4]) + (a.v[2] + a.v[6])) + ((a.v[1] + a.v[5]) + (a.v[3] + a.v[7]));
}
// Lane j of the result is reduce_add(a[j]).
inline VecF transpose_sum(const VecF* a) {
  VecF r;
  for (int j = 0; j < W; ++j) r.v[j] = reduce_add(a[j]);
  return r;
}
inline float reduce_max(VecF a) {
  float m = a.v[0];
  for (int i = 1; i < W; ++i) m = a.v[i] > m ? a.v[i] : m;
  return m;
}

// exp(x): the same range reduction and Cephes polynomial as the x86 headers.
inline VecF exp(VecF x) {
  const F8 lo = F8{} - 87.3f, hi = F8{} + 88.7f;
  F8 v = x.v < lo ? lo : x.v;
  v = v > hi ? hi : v;
  // Round to nearest integer: adding 1.5 * 2^23 leaves no fraction bits (|v log2 e| < 2^22).
  const F8 n = (v * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  F8 r = v - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  F8 p = F8{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + (r + 1.0f);
  const I8 e = (__builtin_convertvector(n, I8) + 127) << 23;
  const F8 res = p * reinterpret_cast<F8>(e);
  // Inputs below the clamp underflow to exactly 0 (masked softmax entries rely on it).
  return {x.v < lo ? F8{} : res};
}

}  // namespace glowlm::vec
