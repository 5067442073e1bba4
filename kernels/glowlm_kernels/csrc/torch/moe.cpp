// Torch binding of the grouped mixture-of-experts op (cpu/moe.h).
#include "cpu/moe.h"

#include <string>

#include "torch/dispatch.h"
#include "torch/ops.h"

namespace glowlm {

at::Tensor fused_moe(const at::Tensor& x_in, const at::Tensor& w13_in, const at::Tensor& w2_in,
                     const at::Tensor& topk_weights, const at::Tensor& topk_ids,
                     const std::string& activation, int64_t gemv_max_m) {
  TORCH_CHECK(x_in.dim() == 2 && w13_in.dim() == 3 && w2_in.dim() == 3,
              "fused_moe: x must be [T, H], w13 [E, 2I, H] and w2 [E, H, I], got ",
              x_in.sizes(), ", ", w13_in.sizes(), ", ", w2_in.sizes());
  const int64_t tokens = x_in.size(0), H = x_in.size(1), E = w13_in.size(0);
  const int64_t I = w2_in.size(2);
  TORCH_CHECK(w13_in.size(1) == 2 * I && w13_in.size(2) == H && w2_in.size(0) == E &&
                  w2_in.size(1) == H,
              "fused_moe: w13 must be [E, 2I, H] and w2 [E, H, I] for x of width ", H);
  TORCH_CHECK(w13_in.scalar_type() == w2_in.scalar_type(),
              "fused_moe: w13 and w2 must have one dtype");
  TORCH_CHECK(topk_ids.dim() == 2 && topk_ids.size(0) == tokens &&
                  topk_weights.sizes() == topk_ids.sizes(),
              "fused_moe: topk_weights and topk_ids must both be [T, k]");
  TORCH_CHECK(activation == "silu" || activation == "gelu_tanh",
              "fused_moe: activation must be silu or gelu_tanh, got ", activation);
  const at::Tensor x = x_in.contiguous(), w13 = w13_in.contiguous(), w2 = w2_in.contiguous();
  const at::Tensor ids = topk_ids.to(at::kLong).contiguous();
  const at::Tensor wts = topk_weights.to(at::kFloat).contiguous();
  const int64_t K = ids.size(1);
  TORCH_CHECK(tokens == 0 || (ids.min().item<int64_t>() >= 0 && ids.max().item<int64_t>() < E),
              "fused_moe: an expert id is outside [0, ", E, ")");
  at::Tensor out = at::empty({tokens, H}, x.options());
  if (tokens == 0) return out;
  GLOWLM_DISPATCH_FLOAT_TYPES(x.scalar_type(), "fused_moe", [&] {
    using xt = scalar_t;
    GLOWLM_DISPATCH_FLOAT_TYPES(w13.scalar_type(), "fused_moe", [&] {
      cpu::fused_moe(ptr<xt>(x), tokens, H, ptr<scalar_t>(w13), ptr<scalar_t>(w2), E, I,
                     wts.data_ptr<float>(), ids.data_ptr<int64_t>(), K,
                     activation == "gelu_tanh", gemv_max_m, ptr<xt>(out));
    });
  });
  return out;
}

}  // namespace glowlm
