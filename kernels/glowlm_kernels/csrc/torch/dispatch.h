// dtype dispatch over the three storage dtypes the kernels support, and tensor storage
// as the algorithms' types (glowlm::bf16 / fp16 have c10::BFloat16 / c10::Half's layout).
#pragma once

#include <torch/all.h>

#include "cpu/types.h"

namespace glowlm {

// A tensor's storage as T (float, bf16 or fp16); the caller dispatched on its dtype.
template <typename T>
inline T* ptr(const at::Tensor& t) {
  return static_cast<T*>(t.data_ptr());
}

}  // namespace glowlm

// Runs the lambda `__VA_ARGS__` with `scalar_t` bound to the kernels' type of DTYPE.
#define GLOWLM_DISPATCH_FLOAT_TYPES(DTYPE, NAME, ...)                         \
  switch (DTYPE) {                                                             \
    case at::kFloat: {                                                         \
      using scalar_t = float;                                                  \
      __VA_ARGS__();                                                           \
      break;                                                                   \
    }                                                                          \
    case at::kBFloat16: {                                                      \
      using scalar_t = glowlm::bf16;                                           \
      __VA_ARGS__();                                                           \
      break;                                                                   \
    }                                                                          \
    case at::kHalf: {                                                          \
      using scalar_t = glowlm::fp16;                                           \
      __VA_ARGS__();                                                           \
      break;                                                                   \
    }                                                                          \
    default:                                                                   \
      TORCH_CHECK(false, NAME, ": unsupported dtype ", DTYPE,                  \
                  " (supported: float32, bfloat16, float16)");                 \
  }

// The KV cache's dtypes: the three float types, the 8-bit floats of
// --kv-cache-dtype fp8 / fp8_e5m2 (c10::Float8_e4m3fn / Float8_e5m2's layout), and
// int8 (rows of values and their fp16 scale, cpu/attention.h).
#define GLOWLM_DISPATCH_KV_TYPES(DTYPE, NAME, ...)                            \
  switch (DTYPE) {                                                             \
    case at::kChar: {                                                          \
      using scalar_t = int8_t;                                                 \
      __VA_ARGS__();                                                           \
      break;                                                                   \
    }                                                                          \
    case at::kFloat8_e4m3fn: {                                                 \
      using scalar_t = glowlm::fp8e4m3;                                        \
      __VA_ARGS__();                                                           \
      break;                                                                   \
    }                                                                          \
    case at::kFloat8_e5m2: {                                                   \
      using scalar_t = glowlm::fp8e5m2;                                        \
      __VA_ARGS__();                                                           \
      break;                                                                   \
    }                                                                          \
    default:                                                                   \
      GLOWLM_DISPATCH_FLOAT_TYPES(DTYPE, NAME, __VA_ARGS__);                   \
  }
