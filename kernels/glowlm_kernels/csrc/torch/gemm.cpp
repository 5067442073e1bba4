// Torch binding of the blocked GEMM (cpu/gemm.h).
#include "cpu/gemm.h"

#include <optional>

#include "torch/dispatch.h"
#include "torch/ops.h"

namespace glowlm {

at::Tensor gemm(const at::Tensor& x_in, const at::Tensor& weight_in,
                const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(x_in.dim() == 2 && weight_in.dim() == 2 && x_in.size(1) == weight_in.size(1),
              "gemm: x must be [M, K] and weight [N, K], got ", x_in.sizes(), " and ",
              weight_in.sizes());
  TORCH_CHECK(!bias || (bias->dim() == 1 && bias->size(0) == weight_in.size(0)),
              "gemm: bias must be [N]");
  const at::Tensor x = x_in.contiguous();
  const at::Tensor weight = weight_in.contiguous();
  std::optional<at::Tensor> bf;
  if (bias) bf = bias->to(at::kFloat).contiguous();
  const int64_t M = x.size(0), K = x.size(1), N = weight.size(0);
  at::Tensor y = at::empty({M, N}, x.options());
  if (M == 0 || N == 0) return y;
  if (K == 0) {
    y.zero_();
    if (bf) y.add_(*bf);
    return y;
  }
  at::Tensor xp = at::empty({cpu::packed_size(M, K)}, x.options().dtype(at::kFloat));
  GLOWLM_DISPATCH_FLOAT_TYPES(x.scalar_type(), "gemm", [&] {
    cpu::pack_activations(ptr<scalar_t>(x), M, K, xp.data_ptr<float>());
  });
  GLOWLM_DISPATCH_FLOAT_TYPES(weight.scalar_type(), "gemm", [&] {
    using WT = scalar_t;
    GLOWLM_DISPATCH_FLOAT_TYPES(y.scalar_type(), "gemm", [&] {
      cpu::gemm_impl(xp.data_ptr<float>(), M, K, ptr<WT>(weight),
                     bf ? bf->data_ptr<float>() : nullptr, ptr<scalar_t>(y), N);
    });
  });
  return y;
}

}  // namespace glowlm
