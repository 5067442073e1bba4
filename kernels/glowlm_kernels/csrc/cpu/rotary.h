// Rotary position embedding, neox (rotate halves) and GPT-J (rotate pairs) styles.
//
// cache is [max_position, rot] float32 with cos in the first half and sin in the
// second (Llama 3 frequency scaling is already folded in by core). Features past rot
// are copied unchanged.
#pragma once

#include "cpu/parallel.h"
#include "cpu/vec.h"

namespace glowlm::cpu {

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

// x: [tokens, heads, head_size] with strides (st, sh, 1); out: contiguous, same shape.
// pos[t] must index the cache (the caller checks).
// Threads only from kRotaryGrain heads on: one head is ~20 ns of work, and a parallel
// region costs microseconds (much more when the other thread was descheduled). A decode
// step's 32-40 heads per layer ran in a two-thread region before: ~7 % of a W4A16
// llama-1b layer's time in a py-spy profile on a busy 2-vCPU host, nearly all of it in
// libgomp's fork/join.
constexpr int64_t kRotaryGrain = 256;

template <typename T>
void rotary_embedding(const int64_t* pos, const T* x, int64_t tokens, int64_t heads,
                      int64_t head_size, int64_t st, int64_t sh, T* out, const float* cache,
                      int64_t rot, bool is_neox) {
  parallel_for(0, tokens * heads, kRotaryGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const int64_t t = i / heads, h = i % heads;
      const float* cos = cache + pos[t] * rot;
      rotate_head(x + t * st + h * sh, out + i * head_size, cos, cos + rot / 2, rot,
                  head_size, is_neox);
    }
  });
}

}  // namespace glowlm::cpu
