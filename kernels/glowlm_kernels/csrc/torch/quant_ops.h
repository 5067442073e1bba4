// Declarations of the quantized linear ops (quant_wna16.cpp, quant_wna8.cpp,
// quant_w8a8.cpp), registered in quant_registration.cpp. Only at::Tensor and the
// standard library: the torch-free drivers (csrc/test) compile the same sources over
// test/aten_shim, which has no more of ATen than that.
#pragma once

#include <torch/all.h>

#include <cstdint>
#include <optional>
#include <tuple>

namespace glowlm {

// quant_wna16.cpp: weight-only int4 / int8, fp32 or bf16 activations (the stack's
// quantized projections).
at::Tensor wna16_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scales,
                        const at::Tensor& zs, int64_t bits, int64_t group_size, int64_t n,
                        const std::optional<at::Tensor>& bias);
// quant_w8a8.cpp: int8 x int8.
at::Tensor w8a8_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& wscale,
                       const at::Tensor& wsum, double input_scale, int64_t input_zp, int64_t n,
                       const std::optional<at::Tensor>& bias);
// w8a8_linear's int8 activations and per-row scales, for another int8 GEMM.
std::tuple<at::Tensor, at::Tensor> quantize_rows(const at::Tensor& x, double input_scale,
                                                 int64_t input_zp);
// quant_wna8.cpp: the weight-only weights with int8 activations per 32 columns (GGUF's
// own arithmetic).
at::Tensor wna8_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scales,
                       const at::Tensor& zs, int64_t bits, int64_t group_size, int64_t n,
                       const std::optional<at::Tensor>& bias);

}  // namespace glowlm
