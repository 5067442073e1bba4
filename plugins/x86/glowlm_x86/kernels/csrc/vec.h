// A small fp32 SIMD vector abstraction for glowlm's CPU kernels.
//
// Kernels are written once against `VecF` (a register of W floats) and the free
// functions below; the ISA header is picked by the compiler flags of the build
// (each ISA is a separate extension module, so an AVX2-only CPU never loads
// AVX-512 code). Another ISA (Arm NEON, s390x VXE) adds its own header with the
// same names, starting from vec_portable.h (GCC vector extensions, any target; built
// with -DGLOWLM_VEC_PORTABLE). Every load converts from the storage dtype (float,
// bf16, fp16) to fp32 in registers and every store rounds back (round-to-nearest-
// even), so the kernels do all math in fp32 whatever the tensor dtype.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(GLOWLM_VEC_PORTABLE)
#include "vec_portable.h"
#elif defined(__AVX512F__)
#include "vec_avx512.h"
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "vec_avx2.h"
#else
#error "glowlm-x86 kernels need AVX2+FMA+F16C, AVX-512, or -DGLOWLM_VEC_PORTABLE"
#endif

// Register tiles are arrays indexed by loop counters (VecF acc[MR][NR]). GCC keeps such
// arrays in registers only if those small loops are unrolled completely before its
// scalar replacement pass; without this it stored every accumulator to the stack on
// each iteration (measured: the GEMM ran at a third of its speed). Put it on every loop
// over a register tile's dimensions.
#define GLOWLM_UNROLL _Pragma("GCC unroll 32")

namespace glowlm::vec {

// Scalar conversions for loop tails; identical rounding to the vector stores.
inline float to_float(float x) { return x; }
inline float to_float(c10::BFloat16 x) { return static_cast<float>(x); }
inline float to_float(c10::Half x) { return static_cast<float>(x); }

template <typename T>
inline T from_float(float x) { return static_cast<T>(x); }

// Software prefetch of one cache line into L1 (a hint: never faults, so it may point
// past the end of a buffer). Portable to every ISA the compiler targets.
inline void prefetch(const void* p) { __builtin_prefetch(p, 0, 3); }

// Prefetch [p, p + bytes) into L1, one hint per 64-byte cache line.
inline void prefetch_range(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t i = 0; i < bytes; i += 64) prefetch(c + i);
}

// Helpers built on exp, shared by every ISA.
inline VecF sigmoid(VecF x) {
  // 1 / (1 + exp(-x)); exp saturates to inf for x << 0, giving 0.
  return div(set1(1.0f), add(set1(1.0f), exp(sub(zero(), x))));
}

inline VecF tanh(VecF x) {
  // tanh(x) = 1 - 2 / (exp(2x) + 1): exact at both saturations.
  VecF e = exp(add(x, x));
  return sub(set1(1.0f), div(set1(2.0f), add(e, set1(1.0f))));
}

}  // namespace glowlm::vec
