// Gemma 3's decoder layers, every layer of a model in one call, for decode.
//
// Why: the Llama-shaped stack (fused_layer.cpp) does not fit Gemma 3 (four norms per
// layer, the last two on the branches; GeGLU; a rotary table per layer type), so Gemma
// ran module by module: about a dozen Python ops per layer, each costing tens of
// microseconds right after a GEMV has streamed the layer's weights through the caches
// (fused_layer.cpp's header has the measurements). On Gemma 3 270M (18 layers, a
// ~15 ms decode step) that glue was several milliseconds.
//
// glowlm.models.gemma3.Gemma3DecoderLayer.forward, step for step, with the same kernels
// as the module path on x86 (the platform's norms, rotary, GEMV/GEMM or quantized
// linears, write_kv + paged_attention; the GeGLU is ATen's tanh GELU times up, as core's
// reference gelu_tanh_and_mul computes it), so results are bit-identical wherever the
// module path runs the same kernels: every global layer, and a local one while its window
// hides no key, and past it, where a local layer attends its window in
// paged_attention_window as the x86 attention backend does. With `tp` (a TP rank's
// shards) the o and down projections' partial outputs are summed over the group in C++
// before their norms (torch/projection.h: RowParallelLinear's order, the module path's
// bits at the same TP size).
#include <ATen/ATen.h>

#include <optional>
#include <tuple>

#include "torch/ops.h"
#include "torch/projection.h"

namespace glowlm {
namespace {

// Projections as rms_decoder_stack_q encodes them (torch/projection.h), so one Python
// helper builds both lists; o and down are row-parallel under tensor parallelism.
using proj::kW8A8;
using proj::Proj;
using proj::row_parallel;

// Core's reference gelu_tanh_and_mul (the op the module path runs on x86): torch's tanh
// GELU of the gate half, rounded to the dtype, times the up half.
at::Tensor gelu_tanh_and_mul(const at::Tensor& x) {
  const int64_t d = x.size(-1) / 2;
  return at::mul(at::gelu(x.narrow(-1, 0, d), "tanh"), x.narrow(-1, d, d));
}

struct Step {  // what every layer of the call shares
  const at::Tensor& positions;
  const at::Tensor& block_tables;
  const at::Tensor& query_start_loc;
  const at::Tensor& seq_lens;
  const at::Tensor& slot_mapping;
  int64_t num_heads, num_kv_heads, head_size;
  double scale, eps;
  int64_t rotary_dim;
  bool is_neox;
  int64_t gemv_max_m;
};

// Weights of one layer in the flat list, in this order (None for absent biases).
enum Slot : int64_t {
  kInputNorm, kQkvW, kQkvB, kQNorm, kKNorm, kOW, kOB, kPostAttnNorm, kPreFfnNorm,
  kGateUpW, kGateUpB, kDownW, kDownB, kPostFfnNorm, kCosSin, kGemmaWeights
};
// Projection j (qkv, o, gate_up, down): its weight and bias slots.
constexpr int64_t kProjSlots[4][2] = {{kQkvW, kQkvB}, {kOW, kOB}, {kGateUpW, kGateUpB},
                                      {kDownW, kDownB}};

at::Tensor need(const c10::List<std::optional<at::Tensor>>& w, int64_t i) {
  std::optional<at::Tensor> t = w.get(i);
  TORCH_CHECK(t.has_value(), "gemma_decoder_stack: weight ", i, " is required but None");
  return *t;
}

// Returns the post-FFN-normed MLP output and the residual stream (the next layer's
// input norm, or the final norm, adds them), as the module path does.
std::tuple<at::Tensor, at::Tensor> gemma_layer(
    const Step& s, const at::Tensor& x, const std::optional<at::Tensor>& residual,
    const c10::List<std::optional<at::Tensor>>& w, int64_t base, const Proj (&p)[4],
    at::Tensor& kv_cache, int64_t window, const shm::Group* tp) {
  const int64_t M = x.size(0), qs = s.num_heads * s.head_size,
                kvs = s.num_kv_heads * s.head_size;
  TORCH_CHECK(p[0].rows() == qs + 2 * kvs,
              "gemma_decoder_stack: qkv rows must be (heads + 2 * kv_heads) * head_size");
  const double eps = s.eps;
  at::Tensor h, res;
  if (residual) {
    std::tie(h, res) = fused_add_rms_norm(x, *residual, need(w, base + kInputNorm), eps);
  } else {
    res = x;
    h = rms_norm(x, need(w, base + kInputNorm), eps);
  }
  at::Tensor qkv = p[0](h, s.gemv_max_m);
  at::Tensor q = qkv.narrow(1, 0, qs).reshape({M, s.num_heads, s.head_size});
  at::Tensor k = qkv.narrow(1, qs, kvs).reshape({M, s.num_kv_heads, s.head_size});
  at::Tensor v = qkv.narrow(1, qs + kvs, kvs).view({M, s.num_kv_heads, s.head_size});
  q = rms_norm(q, need(w, base + kQNorm), eps);
  k = rms_norm(k, need(w, base + kKNorm), eps);
  std::tie(q, k) = rotary_embedding(s.positions, q, k, need(w, base + kCosSin), s.rotary_dim,
                                    s.is_neox);
  write_kv(kv_cache, k, v, s.slot_mapping);
  at::Tensor attn = paged_attention_window(q, kv_cache, s.block_tables, s.query_start_loc,
                                           s.seq_lens, s.scale, window)
                        .flatten(1);
  at::Tensor o = rms_norm(row_parallel(p[1], attn, s.gemv_max_m, tp),
                          need(w, base + kPostAttnNorm), eps);
  std::tie(h, res) = fused_add_rms_norm(o, res, need(w, base + kPreFfnNorm), eps);
  at::Tensor down =
      row_parallel(p[3], gelu_tanh_and_mul(p[2](h, s.gemv_max_m)), s.gemv_max_m, tp);
  return {rms_norm(down, need(w, base + kPostFfnNorm), eps), res};
}

}  // namespace

// Every layer in one call. ``w``: kGemmaWeights tensors per layer in Slot order (the
// layer's own rotary table last: local and global layers differ); ``quant`` / ``info``
// as rms_decoder_stack_q's (three tensors and (bits, param, n) per projection, qkv, o,
// gate_up, down), or empty when every projection is dense; ``windows``: each layer's
// attention window, 0 for none; ``tp``: the TP group of sharded layers (as
// rms_decoder_stack_q's), None unsharded.
std::tuple<at::Tensor, at::Tensor> gemma_decoder_stack(
    const at::Tensor& positions, const at::Tensor& x_in, const std::optional<at::Tensor>& residual,
    const c10::List<std::optional<at::Tensor>>& w,
    const c10::List<std::optional<at::Tensor>>& quant, at::IntArrayRef info,
    at::IntArrayRef windows, at::TensorList kv_caches, int64_t rotary_dim, bool is_neox,
    const at::Tensor& block_tables,
    const at::Tensor& query_start_loc, const at::Tensor& seq_lens, const at::Tensor& slot_mapping,
    int64_t num_heads, int64_t num_kv_heads, int64_t head_size, double scale, double eps,
    int64_t gemv_max_m, const std::optional<at::Tensor>& tp) {
  TORCH_CHECK(x_in.dim() == 2, "gemma_decoder_stack: x must be [tokens, hidden]");
  const int64_t layers = static_cast<int64_t>(kv_caches.size());
  TORCH_CHECK(layers > 0 && static_cast<int64_t>(w.size()) == layers * kGemmaWeights,
              "gemma_decoder_stack: ", w.size(), " weights for ", layers, " layers, expected ",
              static_cast<int64_t>(kGemmaWeights), " per layer");
  const bool quantized = !info.empty();
  TORCH_CHECK(!quantized || (static_cast<int64_t>(info.size()) == layers * 4 * 3 &&
                             static_cast<int64_t>(quant.size()) == layers * 4 * 3),
              "gemma_decoder_stack: expected 4 x (bits, param, n) and 4 x 3 quant tensors "
              "per layer, got ", info.size(), " and ", quant.size(), " for ", layers,
              " layers");
  TORCH_CHECK(static_cast<int64_t>(windows.size()) == layers,
              "gemma_decoder_stack: ", windows.size(), " windows for ", layers, " layers");
  const Step step{positions, block_tables, query_start_loc, seq_lens, slot_mapping,
                  num_heads, num_kv_heads, head_size, scale, eps, rotary_dim, is_neox,
                  gemv_max_m};
  const std::optional<shm::Group> group = proj::tp_group(tp);
  at::Tensor x = x_in;
  std::optional<at::Tensor> res = residual;
  for (int64_t l = 0; l < layers; ++l) {
    const int64_t base = l * kGemmaWeights;
    Proj p[4];
    for (int j = 0; j < 4; ++j) {
      p[j].w = need(w, base + kProjSlots[j][0]);
      p[j].b = w.get(base + kProjSlots[j][1]);
      const int64_t i = (l * 4 + j) * 3;
      if (quantized && info[i] != 0) {
        p[j].bits = info[i];
        p[j].param = info[i + 1];
        p[j].n = info[i + 2];
        p[j].scales = need(quant, i);
        p[j].zs = need(quant, i + 1);
        const std::optional<at::Tensor> in_scale = quant.get(i + 2);
        if (p[j].bits == kW8A8 && in_scale) p[j].input_scale = in_scale->item<float>();
      }
    }
    at::Tensor cache = kv_caches[l];  // a handle on the same storage, written in place
    auto [out, r] = gemma_layer(step, x, res, w, base, p, cache, windows[l],
                                group ? &*group : nullptr);
    x = out;
    res = r;
  }
  return {x, *res};
}

}  // namespace glowlm
