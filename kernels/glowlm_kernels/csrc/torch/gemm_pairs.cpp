// Torch binding of the pair-packed bf16 GEMM (cpu/gemm_pairs.h). Every module declares
// the ops; only builds with the pairwise bf16 dot product implement them (pairs_width()
// says which), so the Python side offers the kernel only where it runs.
#include "cpu/gemm_pairs.h"

#include <optional>

#include "torch/dispatch.h"
#include "torch/ops.h"

namespace glowlm {

int64_t pairs_width() {
#if defined(GLOWLM_VEC_BF16DOT)
  return vec::W;
#else
  return 0;
#endif
}

at::Tensor pack_pairs(const at::Tensor& weight_in) {
  TORCH_CHECK(pairs_width() > 0, "pack_pairs: this kernel build has no bf16 dot product");
  TORCH_CHECK(weight_in.dim() == 2 && weight_in.scalar_type() == at::kBFloat16 &&
                  weight_in.size(1) % 2 == 0,
              "pack_pairs: weight must be bfloat16 [N, K] with K even, got ",
              weight_in.scalar_type(), " ", weight_in.sizes());
  const at::Tensor w = weight_in.contiguous();
  const int64_t N = w.size(0), K = w.size(1), width = pairs_width();
  at::Tensor out = at::empty({(N + width - 1) / width, K / 2, width, 2}, w.options());
#if defined(GLOWLM_VEC_BF16DOT)
  cpu::pack_pairs(ptr<bf16>(w), N, K, ptr<bf16>(out));
#endif
  return out;
}

at::Tensor gemm_pairs(const at::Tensor& x_in, const at::Tensor& packed, int64_t n,
                      const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(pairs_width() > 0, "gemm_pairs: this kernel build has no bf16 dot product");
  TORCH_CHECK(x_in.dim() == 2 && x_in.scalar_type() == at::kBFloat16,
              "gemm_pairs: x must be bfloat16 [M, K], got ", x_in.scalar_type(), " ",
              x_in.sizes());
  TORCH_CHECK(packed.dim() == 4 && packed.scalar_type() == at::kBFloat16 &&
                  packed.is_contiguous() && packed.size(2) == pairs_width() &&
                  packed.size(3) == 2 && packed.size(1) * 2 == x_in.size(1) &&
                  packed.size(0) * pairs_width() >= n && n > (packed.size(0) - 1) * pairs_width(),
              "gemm_pairs: packed must be pack_pairs' [ceil(N / W), K / 2, W, 2] of this K "
              "and N, got ", packed.sizes(), " for K ", x_in.size(1), ", N ", n);
  TORCH_CHECK(!bias || (bias->dim() == 1 && bias->size(0) == n), "gemm_pairs: bias must be [N]");
  const at::Tensor x = x_in.contiguous();
  const int64_t M = x.size(0), K = x.size(1);
  at::Tensor y = at::empty({M, n}, x.options());
  if (M == 0 || n == 0) return y;
#if defined(GLOWLM_VEC_BF16DOT)
  std::optional<at::Tensor> bf;
  if (bias) bf = bias->to(at::kFloat).contiguous();
  const float* b = bf ? bf->data_ptr<float>() : nullptr;
  bf16* out = ptr<bf16>(y);
  cpu::gemm_pairs(ptr<bf16>(x), M, K, ptr<bf16>(packed), n,
                  [&](int64_t m, int64_t n0, const float* vals, int64_t count) {
    bf16* row = out + m * n + n0;
    int64_t j = 0;
    for (; j + vec::W <= count; j += vec::W) {
      vec::VecF v = vec::load(vals + j);
      if (b) v = vec::add(v, vec::load(b + n0 + j));
      vec::store(row + j, v);
    }
    for (; j < count; ++j) row[j] = vec::from_float<bf16>(vals[j] + (b ? b[n0 + j] : 0.0f));
  });
#endif
  return y;
}

}  // namespace glowlm
