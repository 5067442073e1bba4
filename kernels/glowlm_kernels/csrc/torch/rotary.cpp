// Torch binding of the rotary embedding (cpu/rotary.h). Returns new contiguous q and k.
#include "cpu/rotary.h"

#include "torch/dispatch.h"
#include "torch/ops.h"

namespace glowlm {
namespace {

at::Tensor as_heads(const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 3, "rotary_embedding: q/k must be [tokens, heads, head_size], got ",
              x.sizes());
  return x.stride(2) == 1 ? x : x.contiguous();
}

template <typename T>
void rotate(const int64_t* pos, const at::Tensor& x, at::Tensor& out, const float* cache,
            int64_t rot, bool is_neox) {
  cpu::rotary_embedding(pos, ptr<T>(x), x.size(0), x.size(1), x.size(2), x.stride(0),
                        x.stride(1), ptr<T>(out), cache, rot, is_neox);
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> rotary_embedding(const at::Tensor& positions_in,
                                                    const at::Tensor& query_in,
                                                    const at::Tensor& key_in,
                                                    const at::Tensor& cos_sin_cache_in,
                                                    int64_t rotary_dim, bool is_neox) {
  at::Tensor query = as_heads(query_in), key = as_heads(key_in);
  TORCH_CHECK(rotary_dim % 2 == 0 && rotary_dim <= query.size(2) &&
                  rotary_dim <= key.size(2),
              "rotary_embedding: rotary_dim must be even and <= head_size");
  TORCH_CHECK(cos_sin_cache_in.dim() == 2 && cos_sin_cache_in.size(1) == rotary_dim,
              "rotary_embedding: cos_sin_cache must be [max_position, rotary_dim]");
  TORCH_CHECK(query.scalar_type() == key.scalar_type(),
              "rotary_embedding: query and key dtypes differ");
  at::Tensor positions = positions_in.to(at::kLong).contiguous();
  TORCH_CHECK(positions.numel() == query.size(0) && positions.numel() == key.size(0),
              "rotary_embedding: one position per token is required");
  at::Tensor cache = cos_sin_cache_in.to(at::kFloat).contiguous();
  const int64_t* pos = positions.data_ptr<int64_t>();
  const int64_t max_pos = cache.size(0);
  for (int64_t t = 0; t < positions.numel(); ++t) {
    TORCH_CHECK(pos[t] >= 0 && pos[t] < max_pos, "rotary_embedding: position ", pos[t],
                " outside the cos/sin cache of ", max_pos, " positions");
  }
  at::Tensor q_out = at::empty(query.sizes(), query.options());
  at::Tensor k_out = at::empty(key.sizes(), key.options());
  GLOWLM_DISPATCH_FLOAT_TYPES(query.scalar_type(), "rotary_embedding", [&] {
    rotate<scalar_t>(pos, query, q_out, cache.data_ptr<float>(), rotary_dim, is_neox);
    rotate<scalar_t>(pos, key, k_out, cache.data_ptr<float>(), rotary_dim, is_neox);
  });
  return {q_out, k_out};
}

}  // namespace glowlm
