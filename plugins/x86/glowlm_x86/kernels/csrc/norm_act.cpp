// RMSNorm, fused residual-add + RMSNorm, and the gated / plain activations.
//
// One row (token) per task, rows split across threads with at::parallel_for.
// Math is fp32; results are rounded to the activation dtype at the same points
// as core's reference (glowlm.ops.reference), so fp32 results agree to rounding
// of the sum order and bf16/fp16 results to about one ulp.
#include <ATen/Parallel.h>

#include "dispatch.h"
#include "ops.h"
#include "vec.h"

namespace glowlm {
namespace {

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

template <typename T, typename WT>
void rms_norm_impl(const T* x, const WT* w, T* out, int64_t rows, int64_t n, float eps) {
  at::parallel_for(0, rows, kRowGrain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + r * n;
      float inv = 1.0f / std::sqrt(sum_squares(xr, n) / static_cast<float>(n) + eps);
      normalize_row(xr, w, out + r * n, n, inv);
    }
  });
}

template <typename T, typename WT>
void fused_add_rms_norm_impl(const T* x, const T* res, const WT* w, T* out, T* res_out,
                             int64_t rows, int64_t n, float eps) {
  at::parallel_for(0, rows, kRowGrain, [&](int64_t begin, int64_t end) {
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

void check_norm_args(const at::Tensor& x, const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(-1),
              "rms_norm: weight must be [hidden] matching x's last dim, got ",
              weight.sizes(), " for x ", x.sizes());
  TORCH_CHECK(weight.scalar_type() == x.scalar_type() || weight.scalar_type() == at::kFloat,
              "rms_norm: weight dtype must be x's dtype or float32");
}

template <typename F>
void elementwise_rows(int64_t rows, F&& fn) {
  at::parallel_for(0, rows, kRowGrain, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) fn(r);
  });
}

}  // namespace

at::Tensor rms_norm(const at::Tensor& x_in, const at::Tensor& weight_in, double eps) {
  check_norm_args(x_in, weight_in);
  at::Tensor x = x_in.contiguous(), weight = weight_in.contiguous();
  at::Tensor out = at::empty_like(x);
  const int64_t n = x.size(-1), rows = n ? x.numel() / n : 0;
  GLOWLM_DISPATCH_FLOAT_TYPES(x.scalar_type(), "rms_norm", [&] {
    if (weight.scalar_type() == x.scalar_type()) {
      rms_norm_impl(x.data_ptr<scalar_t>(), weight.data_ptr<scalar_t>(),
                    out.data_ptr<scalar_t>(), rows, n, static_cast<float>(eps));
    } else {
      rms_norm_impl(x.data_ptr<scalar_t>(), weight.data_ptr<float>(),
                    out.data_ptr<scalar_t>(), rows, n, static_cast<float>(eps));
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
      fused_add_rms_norm_impl(x.data_ptr<scalar_t>(), res.data_ptr<scalar_t>(),
                              weight.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(),
                              res_out.data_ptr<scalar_t>(), rows, n, static_cast<float>(eps));
    } else {
      fused_add_rms_norm_impl(x.data_ptr<scalar_t>(), res.data_ptr<scalar_t>(),
                              weight.data_ptr<float>(), out.data_ptr<scalar_t>(),
                              res_out.data_ptr<scalar_t>(), rows, n, static_cast<float>(eps));
    }
  });
  return {out, res_out};
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
    const scalar_t* xp = x.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    elementwise_rows(rows, [&](int64_t r) {
      const scalar_t* g = xp + r * two_d;
      const scalar_t* u = g + d;
      scalar_t* o = op + r * d;
      int64_t i = 0;
      for (; i + W <= d; i += W) {
        VecF gv = load(g + i);
        store(o + i, mul(mul(gv, sigmoid(gv)), load(u + i)));
      }
      for (; i < d; ++i) {
        float gv = to_float(g[i]);
        o[i] = from_float<scalar_t>(gv / (1.0f + std::exp(-gv)) * to_float(u[i]));
      }
    });
  });
  return out;
}

namespace {

// Elementwise activation over a contiguous tensor in chunks of kChunk elements.
template <typename VF, typename SF>
at::Tensor activation(const at::Tensor& x_in, const char* name, VF&& vfn, SF&& sfn) {
  constexpr int64_t kChunk = 4096;
  at::Tensor x = x_in.contiguous();
  at::Tensor out = at::empty_like(x);
  const int64_t n = x.numel(), chunks = (n + kChunk - 1) / kChunk;
  GLOWLM_DISPATCH_FLOAT_TYPES(x.scalar_type(), name, [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    at::parallel_for(0, chunks, 1, [&](int64_t b, int64_t e) {
      for (int64_t c = b; c < e; ++c) {
        int64_t i = c * kChunk, end = std::min(n, i + kChunk);
        for (; i + W <= end; i += W) store(op + i, vfn(load(xp + i)));
        for (; i < end; ++i) op[i] = from_float<scalar_t>(sfn(to_float(xp[i])));
      }
    });
  });
  return out;
}

}  // namespace

at::Tensor gelu(const at::Tensor& x) {
  // Exact erf GELU; erf has no vector form here, so the vector path stores and
  // finishes in scalar code (this activation is off the hot path of the
  // supported models: GPT-2 uses the tanh form, OPT uses ReLU).
  auto scalar = [](float v) { return 0.5f * v * (1.0f + std::erf(v * 0.70710678118654752f)); };
  auto vector = [&](VecF v) {
    alignas(64) float tmp[W];
    store(tmp, v);
    for (int j = 0; j < W; ++j) tmp[j] = scalar(tmp[j]);
    return load(static_cast<const float*>(tmp));
  };
  return activation(x, "gelu", vector, scalar);
}

at::Tensor gelu_tanh(const at::Tensor& x) {
  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
  constexpr float kA = 0.7978845608028654f, kB = 0.044715f;
  auto scalar = [](float v) {
    return 0.5f * v * (1.0f + std::tanh(kA * (v + kB * v * v * v)));
  };
  auto vector = [](VecF v) {
    VecF inner = mul(set1(kA), fmadd(mul(set1(kB), mul(v, v)), v, v));
    return mul(mul(set1(0.5f), v), add(set1(1.0f), glowlm::vec::tanh(inner)));
  };
  return activation(x, "gelu_tanh", vector, scalar);
}

}  // namespace glowlm
