// RMSNorm, LayerNorm, their fused residual-add forms, and the activations (torch-free).
//
// One row (token) per task, rows split across threads. Math is fp32; results are
// rounded to the activation dtype at the same points as core's reference
// (glowlm.ops.reference), so fp32 results agree to rounding of the sum order and
// bf16/fp16 results to about one ulp.
#pragma once

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "cpu/parallel.h"
#include "cpu/vec.h"

namespace glowlm::cpu {

using namespace glowlm::vec;

constexpr int64_t kRowGrain = 4;

template <typename T>
float sum_squares(const T* x, int64_t n) {
  VecF acc = zero();
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    VecF v = load(x + i);
    acc = fmadd(v, v, acc);
  }
  float s = reduce_add(acc);
  for (; i < n; ++i) s += to_float(x[i]) * to_float(x[i]);
  return s;
}

// out = round(round(x * inv) * w) when the weight has x's dtype (as the reference
// multiplies in that dtype); out = round(x * inv * w) for a float32 weight.
template <typename T, typename WT>
void normalize_row(const T* x, const WT* w, T* out, int64_t n, float inv) {
  const bool twice = !std::is_same_v<T, float> && std::is_same_v<T, WT>;
  VecF vinv = set1(inv);
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    VecF v = mul(load(x + i), vinv);
    if (twice) {
      store(out + i, v);
      v = load(out + i);
    }
    store(out + i, mul(v, load(w + i)));
  }
  for (; i < n; ++i) {
    float v = to_float(x[i]) * inv;
    if (twice) v = to_float(from_float<T>(v));
    out[i] = from_float<T>(v * to_float(w[i]));
  }
}

// out[r] = rms_norm(x[r]) * w for `rows` rows of n.
template <typename T, typename WT>
void rms_norm(const T* x, const WT* w, T* out, int64_t rows, int64_t n, float eps) {
  parallel_for(0, rows, kRowGrain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + r * n;
      float inv = 1.0f / std::sqrt(sum_squares(xr, n) / static_cast<float>(n) + eps);
      normalize_row(xr, w, out + r * n, n, inv);
    }
  });
}

// res_out = round(x + res); out = rms_norm(res_out) * w.
template <typename T, typename WT>
void fused_add_rms_norm(const T* x, const T* res, const WT* w, T* out, T* res_out,
                        int64_t rows, int64_t n, float eps) {
  parallel_for(0, rows, kRowGrain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + r * n;
      const T* rr = res + r * n;
      T* ro = res_out + r * n;
      int64_t i = 0;
      for (; i + W <= n; i += W) store(ro + i, add(load(xr + i), load(rr + i)));
      for (; i < n; ++i) ro[i] = from_float<T>(to_float(xr[i]) + to_float(rr[i]));
      // The norm reads the rounded sum, as the unfused model would.
      float inv = 1.0f / std::sqrt(sum_squares(ro, n) / static_cast<float>(n) + eps);
      normalize_row(ro, w, out + r * n, n, inv);
    }
  });
}

// LayerNorm of one row: two passes (mean, then the variance about it, as torch computes
// it, rather than E[x^2] - mean^2, which cancels for large means), math in fp32 and one
// rounding of the result. The weight and bias may be x's dtype or fp32; b may be null.
template <typename T, typename WT>
void layer_norm_row(const T* x, const WT* w, const WT* b, T* out, int64_t n, float eps) {
  VecF acc = zero();
  int64_t i = 0;
  for (; i + W <= n; i += W) acc = add(acc, load(x + i));
  float sum = reduce_add(acc);
  for (; i < n; ++i) sum += to_float(x[i]);
  const float mean = sum / static_cast<float>(n);
  const VecF vmean = set1(mean);
  acc = zero();
  for (i = 0; i + W <= n; i += W) {
    VecF d = sub(load(x + i), vmean);
    acc = fmadd(d, d, acc);
  }
  float var = reduce_add(acc);
  for (; i < n; ++i) var += (to_float(x[i]) - mean) * (to_float(x[i]) - mean);
  const float rstd = 1.0f / std::sqrt(var / static_cast<float>(n) + eps);
  const VecF vrstd = set1(rstd);
  for (i = 0; i + W <= n; i += W) {
    VecF y = mul(mul(sub(load(x + i), vmean), vrstd), load(w + i));
    store(out + i, b ? add(y, load(b + i)) : y);
  }
  for (; i < n; ++i) {
    float y = (to_float(x[i]) - mean) * rstd * to_float(w[i]);
    out[i] = from_float<T>(b ? y + to_float(b[i]) : y);
  }
}

// With res: res_out = round(x + res) (what the unfused model's residual add stores),
// then LayerNorm of the rounded sum; without (res null): LayerNorm of x.
template <typename T, typename WT>
void layer_norm(const T* x, const T* res, const WT* w, const WT* b, T* out, T* res_out,
                int64_t rows, int64_t n, float eps) {
  parallel_for(0, rows, kRowGrain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + r * n;
      if (res) {
        const T* rr = res + r * n;
        T* ro = res_out + r * n;
        int64_t i = 0;
        for (; i + W <= n; i += W) store(ro + i, add(load(xr + i), load(rr + i)));
        for (; i < n; ++i) ro[i] = from_float<T>(to_float(xr[i]) + to_float(rr[i]));
        xr = ro;
      }
      layer_norm_row(xr, w, b, out + r * n, n, eps);
    }
  });
}

// out = round(x + y), n elements, one thread (decode-sized rows: a parallel region
// costs more than the add).
template <typename T>
void residual_add(const T* x, const T* y, T* out, int64_t n) {
  int64_t i = 0;
  for (; i + W <= n; i += W) store(out + i, vec::add(load(x + i), load(y + i)));
  for (; i < n; ++i) out[i] = from_float<T>(to_float(x[i]) + to_float(y[i]));
}

// out[r, :d] = silu(x[r, :d]) * x[r, d:] for rows of 2d.
template <typename T>
void silu_and_mul(const T* x, T* out, int64_t rows, int64_t d) {
  parallel_for(0, rows, kRowGrain, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const T* g = x + r * 2 * d;
      const T* u = g + d;
      T* o = out + r * d;
      int64_t i = 0;
      for (; i + W <= d; i += W) {
        VecF gv = load(g + i);
        store(o + i, mul(mul(gv, sigmoid(gv)), load(u + i)));
      }
      for (; i < d; ++i) {
        float gv = to_float(g[i]);
        o[i] = from_float<T>(gv / (1.0f + std::exp(-gv)) * to_float(u[i]));
      }
    }
  });
}

// Elementwise activation over n contiguous elements in chunks of kChunk.
template <typename T, typename VF, typename SF>
void activation(const T* x, T* out, int64_t n, const VF& vfn, const SF& sfn) {
  constexpr int64_t kChunk = 4096;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  parallel_for(0, chunks, 1, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) {
      int64_t i = c * kChunk, end = std::min(n, i + kChunk);
      for (; i + W <= end; i += W) store(out + i, vfn(load(x + i)));
      for (; i < end; ++i) out[i] = from_float<T>(sfn(to_float(x[i])));
    }
  });
}

template <typename T>
void gelu(const T* x, T* out, int64_t n) {
  // Exact (erf) GELU, the activation of BERT-family encoders and ModernBERT. The
  // vector path needs no select: with a = |x| and z = a / sqrt(2), erf is odd, so
  //   0.5 x (1 + erf(x / sqrt(2))) = 0.5 (x + a) - 0.5 a erfc(z).
  // The first term is relu(x), and the second is computed without cancelling 1 - erf.
  // Before this form, the vector path called std::erf lane by lane: BERT-base's GELU
  // took 16 % of a 32 x 128-token bf16 embedding batch on a 2-vCPU Xeon.
  auto scalar = [](float v) { return 0.5f * v * (1.0f + std::erf(v * 0.70710678118654752f)); };
  auto vector = [](VecF v) {
    VecF a = glowlm::vec::max(v, sub(zero(), v));
    VecF tail = mul(a, erfc_nonneg(mul(a, set1(0.70710678118654752f))));
    return mul(set1(0.5f), sub(add(v, a), tail));
  };
  activation(x, out, n, vector, scalar);
}

template <typename T>
void gelu_tanh(const T* x, T* out, int64_t n) {
  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
  constexpr float kA = 0.7978845608028654f, kB = 0.044715f;
  auto scalar = [](float v) {
    return 0.5f * v * (1.0f + std::tanh(kA * (v + kB * v * v * v)));
  };
  auto vector = [](VecF v) {
    VecF inner = mul(set1(kA), fmadd(mul(set1(kB), mul(v, v)), v, v));
    return mul(mul(set1(0.5f), v), add(set1(1.0f), glowlm::vec::tanh(inner)));
  };
  activation(x, out, n, vector, scalar);
}

template <typename T>
void relu(const T* x, T* out, int64_t n) {
  // max(0, x) keeps NaN (the second operand wins when either is NaN), as torch does.
  auto scalar = [](float v) { return std::isnan(v) ? v : std::max(v, 0.0f); };
  auto vector = [](VecF v) { return glowlm::vec::max(zero(), v); };
  activation(x, out, n, vector, scalar);
}

}  // namespace glowlm::cpu
