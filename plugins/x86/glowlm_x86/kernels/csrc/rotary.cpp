// Rotary position embedding, neox (rotate halves) and GPT-J (rotate pairs) styles.
//
// cos_sin_cache is [max_position, rotary_dim] float32 with cos in the first half
// and sin in the second (Llama 3 frequency scaling is already folded in by core).
// Returns new contiguous q and k; features past rotary_dim are copied unchanged.
#include <ATen/Parallel.h>

#include "dispatch.h"
#include "ops.h"
#include "vec.h"

namespace glowlm {
namespace {

using namespace glowlm::vec;

template <typename T>
void rotate_head(const T* x, T* out, const float* cos, const float* sin, int64_t rot,
                 int64_t head_size, bool is_neox) {
  const int64_t half = rot / 2;
  if (is_neox) {
    int64_t i = 0;
    for (; i + W <= half; i += W) {
      VecF x1 = load(x + i), x2 = load(x + half + i);
      VecF c = load(cos + i), s = load(sin + i);
      store(out + i, sub(mul(x1, c), mul(x2, s)));
      store(out + half + i, fmadd(x1, s, mul(x2, c)));
    }
    for (; i < half; ++i) {
      float x1 = to_float(x[i]), x2 = to_float(x[half + i]);
      out[i] = from_float<T>(x1 * cos[i] - x2 * sin[i]);
      out[half + i] = from_float<T>(x2 * cos[i] + x1 * sin[i]);
    }
  } else {
    for (int64_t i = 0; i < half; ++i) {
      float x1 = to_float(x[2 * i]), x2 = to_float(x[2 * i + 1]);
      out[2 * i] = from_float<T>(x1 * cos[i] - x2 * sin[i]);
      out[2 * i + 1] = from_float<T>(x2 * cos[i] + x1 * sin[i]);
    }
  }
  for (int64_t i = rot; i < head_size; ++i) out[i] = x[i];
}

template <typename T>
void rotate_all_style(const int64_t* pos, const at::Tensor& x, at::Tensor& out,
                      const float* cache, int64_t rot, bool is_neox) {
  const int64_t tokens = x.size(0), heads = x.size(1), head_size = x.size(2);
  const int64_t st = x.stride(0), sh = x.stride(1);
  const T* xp = x.data_ptr<T>();
  T* op = out.data_ptr<T>();
  at::parallel_for(0, tokens * heads, 16, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const int64_t t = i / heads, h = i % heads;
      const float* cos = cache + pos[t] * rot;
      rotate_head(xp + t * st + h * sh, op + i * head_size, cos, cos + rot / 2, rot, head_size,
                  is_neox);
    }
  });
}

at::Tensor as_heads(const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 3, "rotary_embedding: q/k must be [tokens, heads, head_size], got ",
              x.sizes());
  return x.stride(2) == 1 ? x : x.contiguous();
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
    rotate_all_style<scalar_t>(pos, query, q_out, cache.data_ptr<float>(), rotary_dim, is_neox);
    rotate_all_style<scalar_t>(pos, key, k_out, cache.data_ptr<float>(), rotary_dim, is_neox);
  });
  return {q_out, k_out};
}

}  // namespace glowlm
