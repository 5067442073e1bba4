// Torch binding of the weight-streaming GEMV (cpu/gemv.h).
#include "cpu/gemv.h"

#include <optional>
#include <vector>

#include "torch/dispatch.h"
#include "torch/ops.h"

namespace glowlm {
namespace {

void check_linear_args(const at::Tensor& x, const at::Tensor& weight,
                       const std::optional<at::Tensor>& bias, const char* name) {
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1), name,
              ": x must be [M, K] and weight [N, K], got ", x.sizes(), " and ",
              weight.sizes());
  TORCH_CHECK(!bias || (bias->dim() == 1 && bias->size(0) == weight.size(0)), name,
              ": bias must be [N]");
}

}  // namespace

at::Tensor gemv(const at::Tensor& x_in, const at::Tensor& weight_in,
                const std::optional<at::Tensor>& bias) {
  check_linear_args(x_in, weight_in, bias, "gemv");
  // Decode calls this ~50-100 times per token on tensors of a few KiB, so the
  // conversions of x and y run here in plain loops rather than as ATen ops (each of
  // which costs microseconds of dispatch and allocation).
  const at::Tensor x = x_in.contiguous();
  const at::Tensor weight = weight_in.contiguous();
  const std::optional<at::Tensor> b = bias ? std::optional<at::Tensor>(bias->contiguous())
                                          : std::nullopt;
  const int64_t M = x.size(0), K = x.size(1), N = weight.size(0);
  at::Tensor out = at::empty({M, N}, x.options());
  if (M == 0 || N == 0) return out;
  thread_local std::vector<float> xbuf, ybuf;
  ybuf.resize(M * N);
  // x is converted to fp32 into xbuf unless the kernel reads it as stored (bf16 x and
  // bf16 weights on a CPU with the pairwise bf16 dot product, cpu::gemv).
  xbuf.resize(M * K);
  GLOWLM_DISPATCH_FLOAT_TYPES(x.scalar_type(), "gemv", [&] {
    using xt = scalar_t;
    GLOWLM_DISPATCH_FLOAT_TYPES(weight.scalar_type(), "gemv", [&] {
      cpu::gemv(ptr<xt>(x), M, K, ptr<scalar_t>(weight), ybuf.data(), N, xbuf.data());
    });
  });
  if (b) {  // bias in its own dtype (usually the model's): added here, no converted copy
    GLOWLM_DISPATCH_FLOAT_TYPES(b->scalar_type(), "gemv", [&] {
      cpu::add_bias(ybuf.data(), ptr<scalar_t>(*b), M, N);
    });
  }
  GLOWLM_DISPATCH_FLOAT_TYPES(out.scalar_type(), "gemv", [&] {
    cpu::from_float_buf(ybuf.data(), ptr<scalar_t>(out), M * N);
  });
  return out;
}

}  // namespace glowlm
