// One projection of a fused decoder layer, and its row-parallel form under tensor
// parallelism: shared by the Llama-shaped stack (fused_layer.cpp) and Gemma 3's
// (gemma_layer.cpp), so both run a projection, and sum it over the TP group, the same way.
#pragma once

#include <ATen/ATen.h>

#include <optional>

#include "cpu/shm_reduce.h"
#include "torch/dispatch.h"
#include "torch/ops.h"

namespace glowlm {
namespace proj {

// The same kernel choice as glowlm_x86.kernels.linear.dense_linear: the weight-streaming
// GEMV up to gemv_max_m token rows, the blocked GEMM beyond. bf16 layers decode on the
// pairwise bf16 dot product where the module has it (gemv -> cpu::gemv -> gemv_bf16:
// vdpbf16ps on AVX512_BF16), like the module path.
inline at::Tensor linear(const at::Tensor& a, const at::Tensor& w,
                         const std::optional<at::Tensor>& b, int64_t gemv_max_m) {
  return a.size(0) <= gemv_max_m ? gemv(a, w, b) : gemm(a, w, b);
}

// bits == kW8A8: int8 x int8 (w8a8_linear's layout).
constexpr int64_t kW8A8 = -8;
// bits | kActInt8: weight-only weights with int8 activations (wna8_linear; GGUF).
constexpr int64_t kActInt8 = 16;

// Dense (bits == 0: w is the [N, K] weight), weight-only quantized (bits 4 or 8: w,
// scales, zs in wna16_linear's prepared layout, `param` the group size; 4 or 8 | kActInt8:
// wna8_linear's, activations quantized to int8 per 32 columns), or int8 x int8
// (bits kW8A8: w, scales = wscale, zs = wsum in w8a8_linear's layout, `param` the input
// zero point, input_scale <= 0 dynamic); n outputs. The Python side encodes a layer
// list's projections once for both stacks (glowlm_x86.kernels.fused._quant_parts).
struct Proj {
  at::Tensor w;
  std::optional<at::Tensor> b;
  at::Tensor scales, zs;
  int64_t bits = 0, param = 0, n = 0;
  double input_scale = -1.0;

  int64_t rows() const { return bits == 0 ? w.size(0) : n; }
  at::Tensor operator()(const at::Tensor& a, int64_t gemv_max_m) const {
    if (bits == 0) return linear(a, w, b, gemv_max_m);
    if (bits == kW8A8) return w8a8_linear(a, w, scales, zs, input_scale, param, n, b);
    if (bits & kActInt8) return wna8_linear(a.contiguous(), w, scales, zs, bits & ~kActInt8,
                                            param, n, b);
    return wna16_linear(a.contiguous(), w, scales, zs, bits, param, n, b);
  }
};

inline Proj dense(const at::Tensor& w, const std::optional<at::Tensor>& b) { return {w, b}; }

// A tensor-parallel stack's group: the `tp` argument, int64 [segment address, world,
// rank, slot bytes, spin ns, op counter] (glowlm.distributed.shm.ShmGroup.native_state;
// the counter is the Python group's own, advanced in place). nullopt: unsharded layers.
inline std::optional<shm::Group> tp_group(const std::optional<at::Tensor>& tp) {
  if (!tp) return std::nullopt;
  TORCH_CHECK(tp->scalar_type() == at::kLong && tp->numel() == 6 && tp->is_contiguous(),
              "decoder stack: tp must be a contiguous int64 tensor of 6 values");
  const shm::Group g = shm::from_state(tp->data_ptr<int64_t>());
  TORCH_CHECK(g.base != nullptr && g.world > 1, "decoder stack: invalid tp group state");
  return g;
}

// A row-parallel projection (o, down) under tensor parallelism: the partial products
// summed over the group, the bias added once after the sum, as RowParallelLinear does
// (same kernels, same order: the module path's bits). tp == nullptr: unsharded.
inline at::Tensor row_parallel(const Proj& p, const at::Tensor& a, int64_t gemv_max_m,
                               const shm::Group* tp) {
  if (tp == nullptr) return p(a, gemv_max_m);
  Proj unbiased = p;
  unbiased.b.reset();
  at::Tensor y = unbiased(a, gemv_max_m).contiguous();
  bool ok = true;
  GLOWLM_DISPATCH_FLOAT_TYPES(y.scalar_type(), "tensor-parallel all-reduce", [&] {
    ok = shm::all_reduce(*tp, ptr<scalar_t>(y), y.numel());
  });
  TORCH_CHECK(ok, "glowlm: the tensor-parallel group was stopped (another rank ended)");
  return p.b ? y.add(*p.b) : y;
}

}  // namespace proj
}  // namespace glowlm
