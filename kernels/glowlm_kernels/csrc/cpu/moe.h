// Mixture-of-experts experts (torch-free): tokens grouped by expert, each routed expert's
// gate|up and down run as one GEMV/GEMM over its tokens, the weighted sum accumulated.
//
// Why grouped: at decode a token reads only its top-k experts, so the bytes per step are
// the routed experts' weights (k * 3 * inter * hidden per token, fewer when tokens of a
// batch share experts), read once each by the weight-streaming GEMV (cpu/gemv.h, which
// splits an expert's rows over the threads). An expert no token chose is never read.
// Larger groups (prefill) run the blocked GEMM (cpu/gemm.h). The activation and the
// weighted sum stay in fp32 (the reference rounds to the model dtype after each step, so
// bf16 results differ within bf16's rounding; fp32 ones by summation order only).
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "cpu/gemm.h"
#include "cpu/gemv.h"

namespace glowlm::cpu {

// y[M, N] (fp32) = x[M, K] w[N, K]^T: the GEMV up to gemv_max_m rows, else the GEMM.
template <typename XT, typename WT>
void expert_matmul(const XT* x, int64_t M, int64_t K, const WT* w, float* y, int64_t N,
                   int64_t gemv_max_m, std::vector<float>& buf) {
  if (M <= gemv_max_m) {
    buf.resize(M * K);
    gemv(x, M, K, w, y, N, buf.data());
  } else {
    buf.resize(packed_size(M, K));
    gemm(x, M, K, w, static_cast<const float*>(nullptr), y, N, buf.data());
  }
}

// out[T, H] = sum_k weights[t, k] * down_e(act(gate_e x_t) * up_e x_t), e = ids[t, k].
// w13: [E, 2I, H] (gate rows then up rows), w2: [E, H, I]; weights fp32, ids int64.
template <typename T, typename WT>
void fused_moe(const T* x, int64_t tokens, int64_t H, const WT* w13, const WT* w2, int64_t E,
               int64_t I, const float* weights, const int64_t* ids, int64_t K, bool gelu_tanh,
               int64_t gemv_max_m, T* out) {
  std::vector<int64_t> count(E + 1, 0);
  for (int64_t i = 0; i < tokens * K; ++i) ++count[ids[i] + 1];
  for (int64_t e = 0; e < E; ++e) count[e + 1] += count[e];
  std::vector<int64_t> slot(tokens * K);  // (token, k) pairs in expert order
  std::vector<int64_t> fill(count.begin(), count.end() - 1);
  for (int64_t i = 0; i < tokens * K; ++i) slot[fill[ids[i]]++] = i;
  std::vector<float> acc(tokens * H, 0.0f), h13, y, buf;
  std::vector<T> xe, act;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t begin = count[e], m = count[e + 1] - begin;
    if (m == 0) continue;
    xe.resize(m * H);
    for (int64_t r = 0; r < m; ++r) {
      const T* src = x + (slot[begin + r] / K) * H;
      std::copy(src, src + H, xe.data() + r * H);
    }
    h13.resize(m * 2 * I);
    expert_matmul(xe.data(), m, H, w13 + e * 2 * I * H, h13.data(), 2 * I, gemv_max_m, buf);
    act.resize(m * I);
    for (int64_t r = 0; r < m; ++r) {
      const float* g = h13.data() + r * 2 * I;
      const float* u = g + I;
      T* a = act.data() + r * I;
      for (int64_t j = 0; j < I; ++j) {
        float v = g[j];
        if (gelu_tanh) {
          constexpr float kA = 0.7978845608028654f, kB = 0.044715f;
          v = 0.5f * v * (1.0f + std::tanh(kA * (v + kB * v * v * v)));
        } else {
          v = v / (1.0f + std::exp(-v));
        }
        a[j] = from_float<T>(v * u[j]);
      }
    }
    y.resize(m * H);
    expert_matmul(act.data(), m, I, w2 + e * H * I, y.data(), H, gemv_max_m, buf);
    for (int64_t r = 0; r < m; ++r) {
      const int64_t pair = slot[begin + r];
      const float wgt = weights[pair];
      float* dst = acc.data() + (pair / K) * H;
      const float* src = y.data() + r * H;
      for (int64_t j = 0; j < H; ++j) dst[j] += wgt * src[j];
    }
  }
  from_float_buf(acc.data(), out, tokens * H);
}

}  // namespace glowlm::cpu
