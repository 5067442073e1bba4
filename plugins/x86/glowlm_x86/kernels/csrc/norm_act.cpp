// RMSNorm, LayerNorm, their fused residual-add forms, and the activations.
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

// sum = round(x + r) (what the unfused model's residual add stores), then LayerNorm of
// the rounded sum. res_out may alias nothing else; out receives the norm.
template <typename T, typename WT>
void layer_norm_impl(const T* x, const T* res, const WT* w, const WT* b, T* out, T* res_out,
                     int64_t rows, int64_t n, float eps) {
  at::parallel_for(0, rows, kRowGrain, [&](int64_t begin, int64_t end) {
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

namespace {

std::tuple<at::Tensor, at::Tensor> layer_norm_common(const at::Tensor& x_in,
                                                     const at::Tensor* residual_in,
                                                     const at::Tensor& weight_in,
                                                     const std::optional<at::Tensor>& bias_in,
                                                     double eps) {
  check_norm_args(x_in, weight_in);
  TORCH_CHECK(!bias_in || (bias_in->sizes() == weight_in.sizes() &&
                           bias_in->scalar_type() == weight_in.scalar_type()),
              "layer_norm: bias must match the weight in shape and dtype");
  TORCH_CHECK(!residual_in || (x_in.sizes() == residual_in->sizes() &&
                               x_in.scalar_type() == residual_in->scalar_type()),
              "add_layer_norm: x and residual must match in shape and dtype");
  at::Tensor x = x_in.contiguous(), weight = weight_in.contiguous();
  at::Tensor res = residual_in ? residual_in->contiguous() : at::Tensor();
  at::Tensor bias = bias_in ? bias_in->contiguous() : at::Tensor();
  at::Tensor out = at::empty_like(x);
  at::Tensor res_out = residual_in ? at::empty_like(x) : at::Tensor();
  const int64_t n = x.size(-1), rows = n ? x.numel() / n : 0;
  GLOWLM_DISPATCH_FLOAT_TYPES(x.scalar_type(), "layer_norm", [&] {
    const scalar_t* rp = residual_in ? res.data_ptr<scalar_t>() : nullptr;
    scalar_t* rop = residual_in ? res_out.data_ptr<scalar_t>() : nullptr;
    if (weight.scalar_type() == x.scalar_type()) {
      layer_norm_impl(x.data_ptr<scalar_t>(), rp, weight.data_ptr<scalar_t>(),
                      bias.defined() ? bias.data_ptr<scalar_t>() : nullptr,
                      out.data_ptr<scalar_t>(), rop, rows, n, static_cast<float>(eps));
    } else {
      layer_norm_impl(x.data_ptr<scalar_t>(), rp, weight.data_ptr<float>(),
                      bias.defined() ? bias.data_ptr<float>() : nullptr,
                      out.data_ptr<scalar_t>(), rop, rows, n, static_cast<float>(eps));
    }
  });
  return {out, res_out};
}

}  // namespace

at::Tensor layer_norm(const at::Tensor& x, const at::Tensor& weight,
                      const std::optional<at::Tensor>& bias, double eps) {
  return std::get<0>(layer_norm_common(x, nullptr, weight, bias, eps));
}

std::tuple<at::Tensor, at::Tensor> add_layer_norm(const at::Tensor& x, const at::Tensor& residual,
                                                  const at::Tensor& weight,
                                                  const std::optional<at::Tensor>& bias,
                                                  double eps) {
  return layer_norm_common(x, &residual, weight, bias, eps);
}

at::Tensor residual_add(const at::Tensor& x_in, const at::Tensor& y_in) {
  TORCH_CHECK(x_in.sizes() == y_in.sizes() && x_in.scalar_type() == y_in.scalar_type(),
              "residual_add: x and y must match in shape and dtype");
  at::Tensor x = x_in.contiguous(), y = y_in.contiguous();
  at::Tensor out = at::empty_like(x);
  const int64_t n = x.numel();
  GLOWLM_DISPATCH_FLOAT_TYPES(x.scalar_type(), "residual_add", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    const scalar_t* yp = y.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    int64_t i = 0;  // decode-sized rows: one thread (a parallel region costs more)
    for (; i + W <= n; i += W) store(op + i, vec::add(load(xp + i), load(yp + i)));
    for (; i < n; ++i) op[i] = from_float<scalar_t>(to_float(xp[i]) + to_float(yp[i]));
  });
  return out;
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

at::Tensor relu(const at::Tensor& x) {
  // max(0, x) keeps NaN (the second operand wins when either is NaN), as torch does.
  auto scalar = [](float v) { return std::isnan(v) ? v : std::max(v, 0.0f); };
  auto vector = [](VecF v) { return glowlm::vec::max(zero(), v); };
  return activation(x, "relu", vector, scalar);
}

}  // namespace glowlm
