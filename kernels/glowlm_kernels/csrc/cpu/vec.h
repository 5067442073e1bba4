// A small fp32 SIMD vector abstraction: the only per-architecture code of the kernels.
//
// Kernels are written once against `VecF` (a register of W floats) and the free
// functions below; the ISA header is picked by the compiler flags of the build (each
// ISA is a separate module, so a CPU never loads code for an ISA it lacks), in the
// spirit of ggml-cpu's arch/ directory:
//   arch/vec_avx512.h    x86 AVX-512 F/BW/VL (16 lanes), also the avx512_bf16 module
//   arch/vec_avx2.h      x86 AVX2 + FMA + F16C (8 lanes)
//   arch/vec_neon.h      Arm NEON (8 lanes in two q registers); BFCVT stores with +bf16
//   arch/vec_portable.h  GCC/Clang vector extensions, any target (8 lanes): the s390x
//                        modules (-march=z14 VXE, -march=z15 VXE2) and the reference port
// Every load converts from the storage dtype (float, bf16, fp16) to fp32 in registers
// and every store rounds back (round-to-nearest-even), so the kernels do all math in
// fp32 whatever the tensor dtype. A new CPU family adds a header with the same names.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "cpu/types.h"

#if defined(GLOWLM_VEC_PORTABLE)
#include "arch/vec_portable.h"
#elif defined(__AVX512F__)
#include "arch/vec_avx512.h"
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "arch/vec_avx2.h"
#elif defined(__aarch64__) && defined(__ARM_NEON)
#include "arch/vec_neon.h"
#elif defined(__s390x__) || defined(__GNUC__)
#include "arch/vec_portable.h"
#else
#error "glowlm kernels: no vector header for this target"
#endif

// Register tiles are arrays indexed by loop counters (VecF acc[MR][NR]). GCC keeps such
// arrays in registers only if those small loops are unrolled completely before its
// scalar replacement pass; without this it stored every accumulator to the stack on
// each iteration (measured: the GEMM ran at a third of its speed). Put it on every loop
// over a register tile's dimensions.
#define GLOWLM_UNROLL _Pragma("GCC unroll 32")

namespace glowlm::vec {

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

// erfc(z) for z >= 0: Abramowitz & Stegun 7.1.26, t = 1 / (1 + p z),
// erfc(z) = t (a1 + t (a2 + t (a3 + t (a4 + t a5)))) exp(-z^2), absolute error at most
// 1.5e-7. This is the same approximation ATen's vectorized erf uses, so glowlm's
// GELU is as accurate as torch's F.gelu, which is the reference.
inline VecF erfc_nonneg(VecF z) {
  VecF t = div(set1(1.0f), fmadd(set1(0.3275911f), z, set1(1.0f)));
  VecF poly = fmadd(set1(1.061405429f), t, set1(-1.453152027f));
  poly = fmadd(poly, t, set1(1.421413741f));
  poly = fmadd(poly, t, set1(-0.284496736f));
  poly = fmadd(poly, t, set1(0.254829592f));
  return mul(mul(poly, t), exp(sub(zero(), mul(z, z))));
}

}  // namespace glowlm::vec
