// Torch binding of the norms and activations (cpu/norm_act.h): argument checks,
// output allocation and dtype dispatch.
#include "cpu/norm_act.h"

#include "torch/dispatch.h"
#include "torch/ops.h"

namespace glowlm {
namespace {

void check_norm_args(const at::Tensor& x, const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(-1),
              "rms_norm: weight must be [hidden] matching x's last dim, got ",
              weight.sizes(), " for x ", x.sizes());
  TORCH_CHECK(weight.scalar_type() == x.scalar_type() || weight.scalar_type() == at::kFloat,
              "rms_norm: weight dtype must be x's dtype or float32");
}

}  // namespace

at::Tensor rms_norm(const at::Tensor& x_in, const at::Tensor& weight_in, double eps) {
  check_norm_args(x_in, weight_in);
  at::Tensor x = x_in.contiguous(), weight = weight_in.contiguous();
  at::Tensor out = at::empty_like(x);
  const int64_t n = x.size(-1), rows = n ? x.numel() / n : 0;
  GLOWLM_DISPATCH_FLOAT_TYPES(x.scalar_type(), "rms_norm", [&] {
    if (weight.scalar_type() == x.scalar_type()) {
      cpu::rms_norm(ptr<scalar_t>(x), ptr<scalar_t>(weight), ptr<scalar_t>(out), rows, n,
                    static_cast<float>(eps));
    } else {
      cpu::rms_norm(ptr<scalar_t>(x), ptr<float>(weight), ptr<scalar_t>(out), rows, n,
                    static_cast<float>(eps));
    }
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm(const at::Tensor& x_in,
                                                      const at::Tensor& residual_in,
                                                      const at::Tensor& weight_in, double eps) {
  check_norm_args(x_in, weight_in);
  TORCH_CHECK(x_in.sizes() == residual_in.sizes() &&
                  x_in.scalar_type() == residual_in.scalar_type(),
              "fused_add_rms_norm: x and residual must match in shape and dtype");
  at::Tensor x = x_in.contiguous(), res = residual_in.contiguous();
  at::Tensor weight = weight_in.contiguous();
  at::Tensor out = at::empty_like(x), res_out = at::empty_like(x);
  const int64_t n = x.size(-1), rows = n ? x.numel() / n : 0;
  GLOWLM_DISPATCH_FLOAT_TYPES(x.scalar_type(), "fused_add_rms_norm", [&] {
    if (weight.scalar_type() == x.scalar_type()) {
      cpu::fused_add_rms_norm(ptr<scalar_t>(x), ptr<scalar_t>(res), ptr<scalar_t>(weight),
                              ptr<scalar_t>(out), ptr<scalar_t>(res_out), rows, n,
                              static_cast<float>(eps));
    } else {
      cpu::fused_add_rms_norm(ptr<scalar_t>(x), ptr<scalar_t>(res), ptr<float>(weight),
                              ptr<scalar_t>(out), ptr<scalar_t>(res_out), rows, n,
                              static_cast<float>(eps));
    }
  });
  return {out, res_out};
}

namespace {

std::tuple<at::Tensor, at::Tensor> layer_norm_common(const at::Tensor& x_in,
                                                     const at::Tensor* residual_in,
                                                     const at::Tensor& weight_in,
                                                     const std::optional<at::Tensor>& bias_in,
                                                     double eps) {
  check_norm_args(x_in, weight_in);
  TORCH_CHECK(!bias_in || (bias_in->sizes() == weight_in.sizes() &&
                           bias_in->scalar_type() == weight_in.scalar_type()),
              "layer_norm: bias must match the weight in shape and dtype");
  TORCH_CHECK(!residual_in || (x_in.sizes() == residual_in->sizes() &&
                               x_in.scalar_type() == residual_in->scalar_type()),
              "add_layer_norm: x and residual must match in shape and dtype");
  at::Tensor x = x_in.contiguous(), weight = weight_in.contiguous();
  at::Tensor res = residual_in ? residual_in->contiguous() : at::Tensor();
  at::Tensor bias = bias_in ? bias_in->contiguous() : at::Tensor();
  at::Tensor out = at::empty_like(x);
  at::Tensor res_out = residual_in ? at::empty_like(x) : at::Tensor();
  const int64_t n = x.size(-1), rows = n ? x.numel() / n : 0;
  GLOWLM_DISPATCH_FLOAT_TYPES(x.scalar_type(), "layer_norm", [&] {
    const scalar_t* rp = residual_in ? ptr<scalar_t>(res) : nullptr;
    scalar_t* rop = residual_in ? ptr<scalar_t>(res_out) : nullptr;
    if (weight.scalar_type() == x.scalar_type()) {
      cpu::layer_norm(ptr<scalar_t>(x), rp, ptr<scalar_t>(weight),
                      bias.defined() ? ptr<scalar_t>(bias) : nullptr, ptr<scalar_t>(out), rop,
                      rows, n, static_cast<float>(eps));
    } else {
      cpu::layer_norm(ptr<scalar_t>(x), rp, ptr<float>(weight),
                      bias.defined() ? ptr<float>(bias) : nullptr, ptr<scalar_t>(out), rop,
                      rows, n, static_cast<float>(eps));
    }
  });
  return {out, res_out};
}

}  // namespace

at::Tensor layer_norm(const at::Tensor& x, const at::Tensor& weight,
                      const std::optional<at::Tensor>& bias, double eps) {
  return std::get<0>(layer_norm_common(x, nullptr, weight, bias, eps));
}

std::tuple<at::Tensor, at::Tensor> add_layer_norm(const at::Tensor& x, const at::Tensor& residual,
                                                  const at::Tensor& weight,
                                                  const std::optional<at::Tensor>& bias,
                                                  double eps) {
  return layer_norm_common(x, &residual, weight, bias, eps);
}

at::Tensor residual_add(const at::Tensor& x_in, const at::Tensor& y_in) {
  TORCH_CHECK(x_in.sizes() == y_in.sizes() && x_in.scalar_type() == y_in.scalar_type(),
              "residual_add: x and y must match in shape and dtype");
  at::Tensor x = x_in.contiguous(), y = y_in.contiguous();
  at::Tensor out = at::empty_like(x);
  GLOWLM_DISPATCH_FLOAT_TYPES(x.scalar_type(), "residual_add", [&] {
    cpu::residual_add(ptr<scalar_t>(x), ptr<scalar_t>(y), ptr<scalar_t>(out), x.numel());
  });
  return out;
}

at::Tensor silu_and_mul(const at::Tensor& x_in) {
  TORCH_CHECK(x_in.size(-1) % 2 == 0, "silu_and_mul: last dim must be even, got ",
              x_in.size(-1));
  at::Tensor x = x_in.contiguous();
  const int64_t two_d = x.size(-1), d = two_d / 2, rows = two_d ? x.numel() / two_d : 0;
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = d;
  at::Tensor out = at::empty(shape, x.options());
  GLOWLM_DISPATCH_FLOAT_TYPES(x.scalar_type(), "silu_and_mul", [&] {
    cpu::silu_and_mul(ptr<scalar_t>(x), ptr<scalar_t>(out), rows, d);
  });
  return out;
}

#define GLOWLM_ELEMENTWISE(NAME)                                                     \
  at::Tensor NAME(const at::Tensor& x_in) {                                          \
    at::Tensor x = x_in.contiguous();                                                \
    at::Tensor out = at::empty_like(x);                                              \
    GLOWLM_DISPATCH_FLOAT_TYPES(x.scalar_type(), #NAME, [&] {                        \
      cpu::NAME(ptr<scalar_t>(x), ptr<scalar_t>(out), x.numel());                    \
    });                                                                              \
    return out;                                                                      \
  }

GLOWLM_ELEMENTWISE(gelu)
GLOWLM_ELEMENTWISE(gelu_tanh)
GLOWLM_ELEMENTWISE(relu)
#undef GLOWLM_ELEMENTWISE

}  // namespace glowlm
