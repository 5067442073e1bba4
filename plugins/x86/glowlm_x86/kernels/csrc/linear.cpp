// Weight-streaming GEMV for decode (a few token rows); larger M runs gemm.cpp.
//
// Decode is bound by memory bandwidth: every weight byte must be read once per
// step and no more. `gemv` walks the weight in tiles of 4 output rows, converts
// bf16/fp16 to fp32 in registers, and multiplies each tile with every token row
// while the tile is still in L1/L2 (fp32 accumulate). Output rows are split
// across threads, so each thread streams its own slice of the weight.
#include <ATen/Parallel.h>

#include <optional>

#include "dispatch.h"
#include "ops.h"
#include "parallel.h"
#include "vec.h"

namespace glowlm {
namespace {

using namespace glowlm::vec;

constexpr int kNR = 4;  // weight rows per register tile

// y[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n]) for MR token rows and NR weight rows.
template <int MR, int NR, typename WT>
inline void gemv_tile(const float* x, int64_t K, const WT* w, const float* bias, float* y,
                      int64_t ldy) {
  VecF acc[MR][NR];
  GLOWLM_UNROLL for (int m = 0; m < MR; ++m) {
    GLOWLM_UNROLL for (int n = 0; n < NR; ++n) acc[m][n] = zero();
  }
  int64_t k = 0;
  for (; k + W <= K; k += W) {
    VecF wv[NR];
    GLOWLM_UNROLL for (int n = 0; n < NR; ++n) wv[n] = load(w + n * K + k);
    GLOWLM_UNROLL for (int m = 0; m < MR; ++m) {
      VecF xv = load(x + m * K + k);
      GLOWLM_UNROLL for (int n = 0; n < NR; ++n) acc[m][n] = fmadd(xv, wv[n], acc[m][n]);
    }
  }
  for (int m = 0; m < MR; ++m) {
    for (int n = 0; n < NR; ++n) {
      float s = reduce_add(acc[m][n]);
      for (int64_t kk = k; kk < K; ++kk) s += x[m * K + kk] * to_float(w[n * K + kk]);
      y[m * ldy + n] = bias ? s + bias[n] : s;
    }
  }
}

template <int NR, typename WT>
inline void gemv_rows(const float* x, int64_t M, int64_t K, const WT* w, const float* bias,
                      float* y, int64_t N) {
  constexpr int MR = kGemvMR;
  int64_t m = 0;
  for (; m + MR <= M; m += MR) gemv_tile<MR, NR>(x + m * K, K, w, bias, y + m * N, N);
  for (; m < M; ++m) gemv_tile<1, NR>(x + m * K, K, w, bias, y + m * N, N);
}

template <typename WT>
void gemv_impl(const float* x, int64_t M, int64_t K, const WT* w, const float* bias, float* y,
               int64_t N) {
  // Chunks of 16 row tiles (64 output rows): long contiguous weight streams per
  // chunk, and enough chunks (>= 32 on these shapes) to balance uneven threads.
  constexpr int64_t kTilesPerChunk = 16;
  const int64_t tiles = (N + kNR - 1) / kNR;
  const int64_t chunks = (tiles + kTilesPerChunk - 1) / kTilesPerChunk;
  parallel_chunks(chunks, [&](int64_t c) {
    const int64_t end = std::min(tiles, (c + 1) * kTilesPerChunk);
    for (int64_t t = c * kTilesPerChunk; t < end; ++t) {
      const int64_t n0 = t * kNR;
      const float* b = bias ? bias + n0 : nullptr;
      if (n0 + kNR <= N) {
        gemv_rows<kNR>(x, M, K, w + n0 * K, b, y + n0, N);
      } else {
        for (int64_t n = n0; n < N; ++n)
          gemv_rows<1>(x, M, K, w + n * K, bias ? bias + n : nullptr, y + n, N);
      }
    }
  });
}

void check_linear_args(const at::Tensor& x, const at::Tensor& weight,
                       const std::optional<at::Tensor>& bias, const char* name) {
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1), name,
              ": x must be [M, K] and weight [N, K], got ", x.sizes(), " and ",
              weight.sizes());
  TORCH_CHECK(!bias || (bias->dim() == 1 && bias->size(0) == weight.size(0)), name,
              ": bias must be [N]");
}

}  // namespace

at::Tensor gemv(const at::Tensor& x, const at::Tensor& weight_in,
                const std::optional<at::Tensor>& bias) {
  check_linear_args(x, weight_in, bias, "gemv");
  at::Tensor xf = x.to(at::kFloat).contiguous();
  at::Tensor weight = weight_in.contiguous();
  std::optional<at::Tensor> bf;
  if (bias) bf = bias->to(at::kFloat).contiguous();
  const int64_t M = x.size(0), K = x.size(1), N = weight.size(0);
  at::Tensor y = at::empty({M, N}, x.options().dtype(at::kFloat));
  if (M == 0 || N == 0) return y.to(x.scalar_type());
  GLOWLM_DISPATCH_FLOAT_TYPES(weight.scalar_type(), "gemv", [&] {
    gemv_impl(xf.data_ptr<float>(), M, K, weight.data_ptr<scalar_t>(),
              bf ? bf->data_ptr<float>() : nullptr, y.data_ptr<float>(), N);
  });
  return x.scalar_type() == at::kFloat ? y : y.to(x.scalar_type());
}

}  // namespace glowlm
