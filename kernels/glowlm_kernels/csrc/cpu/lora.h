// LoRA adapters' updates after a linear layer's base matmul (torch-free).
//
// out[i] = y[i] + (x[i] a[s]^T) b[s]^T for each row i on slot s = slots[i] (-1: y[i] as it
// is), a: [S, k, in], b: [S, out, k] (glowlm/lora/slots.py: k = projections x rank, the
// scale folded into b). The rows of one slot are gathered once and run as two matmuls,
// shrink [m, in] x [k, in]^T and expand [m, k] x [out, k]^T, on the weight-streaming GEMV
// (cpu/gemv.h) up to gemv_max_m rows, else the blocked GEMM (cpu/gemm.h). A slot no row
// uses is never read, and each used slot's A and B are read once per call whatever its
// row count: the bytes of a step are the adapters in the batch, not the rows.
//
// Why compiled: with torch's matmuls the four ATen calls per slot per layer (gather, two
// GEMMs, scatter-add) cost more than the reads, and bf16 GEMMs on CPUs without AVX-512
// BF16 fall back to slow paths; here the intermediate stays in fp32 and x is converted
// once per call.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "cpu/gemm.h"
#include "cpu/gemv.h"

namespace glowlm::cpu {

// y[M, N] (fp32) = x[M, K] (fp32) w[N, K]^T.
template <typename WT>
void lora_matmul(const float* x, int64_t M, int64_t K, const WT* w, float* y, int64_t N,
                 int64_t gemv_max_m, std::vector<float>& buf) {
  if (M <= gemv_max_m) {
    gemv_f32(x, M, K, w, y, N);
  } else {
    buf.resize(packed_size(M, K));
    gemm(x, M, K, w, static_cast<const float*>(nullptr), y, N, buf.data());
  }
}

template <typename T, typename WT>
void lora_shrink_expand(const T* y, const T* x, int64_t n, int64_t in, const WT* a,
                        const WT* b, int64_t S, int64_t k, int64_t out_features,
                        const int64_t* slots, int64_t gemv_max_m, T* out) {
  std::copy(y, y + n * out_features, out);
  std::vector<std::vector<int64_t>> rows(S);
  for (int64_t i = 0; i < n; ++i)
    if (slots[i] >= 0) rows[slots[i]].push_back(i);
  std::vector<float> xg, t, d, buf;
  for (int64_t s = 0; s < S; ++s) {
    const int64_t m = static_cast<int64_t>(rows[s].size());
    if (m == 0) continue;
    xg.resize(m * in);
    for (int64_t r = 0; r < m; ++r) to_float_buf(x + rows[s][r] * in, xg.data() + r * in, in);
    t.resize(m * k);
    lora_matmul(xg.data(), m, in, a + s * k * in, t.data(), k, gemv_max_m, buf);
    d.resize(m * out_features);
    lora_matmul(t.data(), m, k, b + s * out_features * k, d.data(), out_features, gemv_max_m,
                buf);
    for (int64_t r = 0; r < m; ++r) {
      T* o = out + rows[s][r] * out_features;
      const float* dr = d.data() + r * out_features;
      for (int64_t j = 0; j < out_features; ++j)
        o[j] = from_float<T>(to_float(o[j]) + dr[j]);
    }
  }
}

}  // namespace glowlm::cpu
