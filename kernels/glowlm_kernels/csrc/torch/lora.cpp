// Torch binding of the LoRA update op (cpu/lora.h).
#include "cpu/lora.h"

#include "torch/dispatch.h"
#include "torch/ops.h"

namespace glowlm {

at::Tensor lora_shrink_expand(const at::Tensor& y_in, const at::Tensor& x_in,
                              const at::Tensor& a_in, const at::Tensor& b_in,
                              const at::Tensor& slots_in, int64_t gemv_max_m) {
  TORCH_CHECK(y_in.dim() == 2 && x_in.dim() == 2 && a_in.dim() == 3 && b_in.dim() == 3,
              "lora_shrink_expand: y must be [n, out], x [n, in], a [S, k, in] and b "
              "[S, out, k], got ", y_in.sizes(), ", ", x_in.sizes(), ", ", a_in.sizes(), ", ",
              b_in.sizes());
  const int64_t n = x_in.size(0), in = x_in.size(1), S = a_in.size(0), k = a_in.size(1);
  const int64_t out_features = y_in.size(1);
  TORCH_CHECK(y_in.size(0) == n && a_in.size(2) == in && b_in.size(0) == S &&
                  b_in.size(1) == out_features && b_in.size(2) == k,
              "lora_shrink_expand: shapes do not compose: y ", y_in.sizes(), ", x ",
              x_in.sizes(), ", a ", a_in.sizes(), ", b ", b_in.sizes());
  TORCH_CHECK(x_in.scalar_type() == y_in.scalar_type() &&
                  a_in.scalar_type() == b_in.scalar_type(),
              "lora_shrink_expand: x and y must share a dtype, and so must a and b");
  TORCH_CHECK(slots_in.dim() == 1 && slots_in.size(0) == n,
              "lora_shrink_expand: slots must be [n], got ", slots_in.sizes());
  const at::Tensor y = y_in.contiguous(), x = x_in.contiguous();
  const at::Tensor a = a_in.contiguous(), b = b_in.contiguous();
  const at::Tensor slots = slots_in.to(at::kLong).contiguous();
  TORCH_CHECK(n == 0 || (slots.min().item<int64_t>() >= -1 && slots.max().item<int64_t>() < S),
              "lora_shrink_expand: a slot is outside [-1, ", S, ")");
  at::Tensor out = at::empty_like(y);
  if (n == 0) return out;
  GLOWLM_DISPATCH_FLOAT_TYPES(x.scalar_type(), "lora_shrink_expand", [&] {
    using xt = scalar_t;
    GLOWLM_DISPATCH_FLOAT_TYPES(a.scalar_type(), "lora_shrink_expand", [&] {
      cpu::lora_shrink_expand(ptr<xt>(y), ptr<xt>(x), n, in, ptr<scalar_t>(a),
                              ptr<scalar_t>(b), S, k, out_features, slots.data_ptr<int64_t>(),
                              gemv_max_m, ptr<xt>(out));
    });
  });
  return out;
}

}  // namespace glowlm
