// dtype dispatch over the three storage dtypes the kernels support.
#pragma once

#include <torch/all.h>

// Runs the lambda `__VA_ARGS__` with `scalar_t` bound to the C++ type of DTYPE.
#define GLOWLM_DISPATCH_FLOAT_TYPES(DTYPE, NAME, ...)                         \
  switch (DTYPE) {                                                             \
    case at::kFloat: {                                                         \
      using scalar_t = float;                                                  \
      __VA_ARGS__();                                                           \
      break;                                                                   \
    }                                                                          \
    case at::kBFloat16: {                                                      \
      using scalar_t = c10::BFloat16;                                          \
      __VA_ARGS__();                                                           \
      break;                                                                   \
    }                                                                          \
    case at::kHalf: {                                                          \
      using scalar_t = c10::Half;                                              \
      __VA_ARGS__();                                                           \
      break;                                                                   \
    }                                                                          \
    default:                                                                   \
      TORCH_CHECK(false, NAME, ": unsupported dtype ", DTYPE,                  \
                  " (supported: float32, bfloat16, float16)");                 \
  }
