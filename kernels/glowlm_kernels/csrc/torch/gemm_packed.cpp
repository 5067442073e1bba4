// Torch binding of the block-packed GEMM (cpu/gemm_packed.h): fp32 weights on every
// build, bf16 weights on builds with the pairwise bf16 dot product. Every module declares
// the ops; packed_width(dtype) says which dtypes this one runs (0: the others refuse).
#include "cpu/gemm_packed.h"

#include <optional>
#include <vector>

#include "torch/dispatch.h"
#include "torch/ops.h"

namespace glowlm {
namespace {

bool packed_dtype(at::ScalarType t) {
#if defined(GLOWLM_VEC_BF16DOT)
  if (t == at::kBFloat16) return true;
#endif
  return t == at::kFloat;
}

int64_t packed_step(at::ScalarType t) { return t == at::kBFloat16 ? 2 : 1; }

}  // namespace

int64_t packed_width(at::ScalarType dtype) { return packed_dtype(dtype) ? vec::W : 0; }

namespace {

// The [ceil(N / W), K / S, W, S] shape of weight's packed copy (checks the weight).
std::vector<int64_t> packed_shape(const at::Tensor& weight) {
  const auto t = weight.scalar_type();
  TORCH_CHECK(packed_dtype(t), "pack_blocks: this kernel build has no packed GEMM for ", t,
              " (float32 everywhere; bfloat16 needs a bf16 dot product)");
  const int64_t S = packed_step(t);
  TORCH_CHECK(weight.dim() == 2 && weight.size(1) % S == 0,
              "pack_blocks: weight must be [N, K]", S == 2 ? " with K even" : "", ", got ",
              weight.sizes());
  return {(weight.size(0) + vec::W - 1) / vec::W, weight.size(1) / S, vec::W, S};
}

}  // namespace

void pack_blocks_into(const at::Tensor& weight_in, at::Tensor& out) {
  const std::vector<int64_t> shape = packed_shape(weight_in);
  TORCH_CHECK(out.scalar_type() == weight_in.scalar_type() && out.is_contiguous() &&
                  out.sizes() == at::IntArrayRef(shape),
              "pack_blocks_into: out must be a contiguous ", weight_in.scalar_type(), " ",
              at::IntArrayRef(shape), ", got ", out.scalar_type(), " ", out.sizes());
  const at::Tensor w = weight_in.contiguous();
  const int64_t N = w.size(0), K = w.size(1);
  if (w.scalar_type() == at::kFloat) {
    cpu::pack_blocks(ptr<float>(w), N, K, ptr<float>(out));
  } else {
#if defined(GLOWLM_VEC_BF16DOT)
    cpu::pack_blocks(ptr<bf16>(w), N, K, ptr<bf16>(out));
#endif
  }
}

at::Tensor pack_blocks(const at::Tensor& weight) {
  at::Tensor out = at::empty(packed_shape(weight), weight.options());
  pack_blocks_into(weight, out);
  return out;
}

namespace {

template <typename T>
void run_packed(const at::Tensor& x, const at::Tensor& packed, int64_t n, const float* b,
                at::Tensor& y) {
  const int64_t M = x.size(0), K = x.size(1);
  T* out = ptr<T>(y);
  cpu::gemm_packed(ptr<T>(x), M, K, ptr<T>(packed), n,
                   [&](int64_t m, int64_t n0, const float* vals, int64_t count) {
    T* row = out + m * n + n0;
    int64_t j = 0;
    for (; j + vec::W <= count; j += vec::W) {
      vec::VecF v = vec::load(vals + j);
      if (b) v = vec::add(v, vec::load(b + n0 + j));
      vec::store(row + j, v);
    }
    for (; j < count; ++j) row[j] = vec::from_float<T>(vals[j] + (b ? b[n0 + j] : 0.0f));
  });
}

}  // namespace

at::Tensor gemm_packed(const at::Tensor& x_in, const at::Tensor& packed, int64_t n,
                       const std::optional<at::Tensor>& bias) {
  const auto t = packed.scalar_type();
  TORCH_CHECK(packed_dtype(t), "gemm_packed: this kernel build has no packed GEMM for ", t);
  TORCH_CHECK(x_in.dim() == 2 && x_in.scalar_type() == t, "gemm_packed: x must be ", t,
              " [M, K] like the packed weight, got ", x_in.scalar_type(), " ", x_in.sizes());
  const int64_t S = packed_step(t), width = vec::W;
  TORCH_CHECK(packed.dim() == 4 && packed.is_contiguous() && packed.size(2) == width &&
                  packed.size(3) == S && packed.size(1) * S == x_in.size(1) &&
                  packed.size(0) * width >= n && n > (packed.size(0) - 1) * width,
              "gemm_packed: packed must be pack_blocks' [ceil(N / W), K / S, W, S] of this K "
              "and N, got ", packed.sizes(), " for K ", x_in.size(1), ", N ", n);
  TORCH_CHECK(!bias || (bias->dim() == 1 && bias->size(0) == n), "gemm_packed: bias must be [N]");
  const at::Tensor x = x_in.contiguous();
  at::Tensor y = at::empty({x.size(0), n}, x.options());
  if (x.size(0) == 0 || n == 0) return y;
  std::optional<at::Tensor> bf;
  if (bias) bf = bias->to(at::kFloat).contiguous();
  const float* b = bf ? bf->data_ptr<float>() : nullptr;
  if (t == at::kFloat) {
    run_packed<float>(x, packed, n, b, y);
  } else {
#if defined(GLOWLM_VEC_BF16DOT)
    run_packed<bf16>(x, packed, n, b, y);
#endif
  }
  return y;
}

}  // namespace glowlm
