// Whole decoder layers in one call, for decode: a pre-LayerNorm layer (OPT, GPT-2)
// and an RMSNorm layer (Llama, Mistral, Qwen2, Qwen3).
//
// Why: at decode the layer's small steps (norms, the q/k/v split, residual adds, the
// activation) take microseconds each as kernels, but from Python each one costs tens:
// every GEMV streams megabytes of weights through the caches and evicts the
// interpreter's and the dispatcher's working set, so the Python between two GEMVs
// runs from DRAM (measured here: a 2048-element add costs 2.4 us warm, 23-33 us right
// after a 64 MB GEMV). On opt-125m that glue was about a quarter of each decode step.
// This op runs the same kernels in the same order as the module path (so results are
// bit-identical), with nothing but C++ between them.
#include <ATen/ATen.h>

#include <optional>
#include <string>
#include <tuple>

#include "torch/dispatch.h"
#include "torch/ops.h"
#include "torch/projection.h"

namespace glowlm {
namespace {

using proj::dense;
using proj::kW8A8;
using proj::linear;
using proj::Proj;
using proj::row_parallel;
using proj::tp_group;

}  // namespace

namespace {

// glowlm.models.opt/gpt2's pre-LayerNorm layer, step for step. Under tensor parallelism
// (tp) the weights are this rank's shards: qkv holds num_heads (this rank's) heads of q,
// k and v, fc1 its slice of the MLP, and the out and fc2 projections are row-parallel
// (partial sums over the group, their biases added once after; torch/projection.h).
at::Tensor ln_layer(const at::Tensor& x, const at::Tensor& ln1_w,
                    const std::optional<at::Tensor>& ln1_b, const at::Tensor& qkv_w,
                    const std::optional<at::Tensor>& qkv_b, const at::Tensor& out_w,
                    const std::optional<at::Tensor>& out_b, const at::Tensor& ln2_w,
                    const std::optional<at::Tensor>& ln2_b, const at::Tensor& fc1_w,
                    const std::optional<at::Tensor>& fc1_b, const at::Tensor& fc2_w,
                    const std::optional<at::Tensor>& fc2_b, at::Tensor& kv_cache,
                    const at::Tensor& block_tables, const at::Tensor& query_start_loc,
                    const at::Tensor& seq_lens, const at::Tensor& slot_mapping,
                    int64_t num_heads, double scale, double eps, c10::string_view activation,
                    int64_t gemv_max_m, const shm::Group* tp) {
  TORCH_CHECK(x.dim() == 2, "ln_decoder_layer: x must be [tokens, hidden]");
  const int64_t M = x.size(0), H = x.size(1), R = qkv_w.size(0);
  // q, k and v of num_heads heads each: the whole hidden size unsharded, 1/tp of it
  // on a tensor-parallel rank.
  TORCH_CHECK(num_heads > 0 && R % (3 * num_heads) == 0 && (tp != nullptr || R == 3 * H),
              "ln_decoder_layer: qkv weight must be [3 * hidden, hidden] with hidden a "
              "multiple of num_heads (a TP rank: 3 x its heads' width)");
  const std::string act(activation);
  TORCH_CHECK(act == "relu" || act == "gelu" || act == "gelu_tanh",
              "ln_decoder_layer: activation must be relu, gelu or gelu_tanh, got ", act);
  const int64_t qs = R / 3, hd = qs / num_heads;
  // Only glowlm kernels and views below: each ATen op costs microseconds here, where
  // the streamed weights have just evicted the dispatcher's code and data.
  at::Tensor qkv = linear(glowlm::layer_norm(x, ln1_w, ln1_b, eps), qkv_w, qkv_b, gemv_max_m);
  const auto part = [&](int64_t i) {  // q, k, v: strided views of qkv's rows, no copy
    return at::from_blob(static_cast<char*>(qkv.data_ptr()) + i * qs * qkv.element_size(),
                         {M, num_heads, hd}, {R, hd, 1}, qkv.options());
  };
  const at::Tensor q = part(0), k = part(1), v = part(2);
  write_kv(kv_cache, k, v, slot_mapping);
  at::Tensor attn = paged_attention(q, kv_cache, block_tables, query_start_loc, seq_lens, scale);
  at::Tensor o = row_parallel(dense(out_w, out_b), attn.view({M, qs}), gemv_max_m, tp);
  // x1 = x + o, rounded to the dtype as the unfused residual add stores it
  auto [h, x1] = glowlm::add_layer_norm(o, x, ln2_w, ln2_b, eps);
  h = linear(h, fc1_w, fc1_b, gemv_max_m);
  h = act == "relu"   ? glowlm::relu(h)
      : act == "gelu" ? glowlm::gelu(h)
                      : glowlm::gelu_tanh(h);
  return glowlm::residual_add(x1, row_parallel(dense(fc2_w, fc2_b), h, gemv_max_m, tp));
}

}  // namespace

at::Tensor ln_decoder_layer(const at::Tensor& x, const at::Tensor& ln1_w,
                            const std::optional<at::Tensor>& ln1_b, const at::Tensor& qkv_w,
                            const std::optional<at::Tensor>& qkv_b, const at::Tensor& out_w,
                            const std::optional<at::Tensor>& out_b, const at::Tensor& ln2_w,
                            const std::optional<at::Tensor>& ln2_b, const at::Tensor& fc1_w,
                            const std::optional<at::Tensor>& fc1_b, const at::Tensor& fc2_w,
                            const std::optional<at::Tensor>& fc2_b, at::Tensor& kv_cache,
                            const at::Tensor& block_tables, const at::Tensor& query_start_loc,
                            const at::Tensor& seq_lens, const at::Tensor& slot_mapping,
                            int64_t num_heads, double scale, double eps,
                            c10::string_view activation, int64_t gemv_max_m) {
  return ln_layer(x, ln1_w, ln1_b, qkv_w, qkv_b, out_w, out_b, ln2_w, ln2_b, fc1_w, fc1_b,
                  fc2_w, fc2_b, kv_cache, block_tables, query_start_loc, seq_lens,
                  slot_mapping, num_heads, scale, eps, activation, gemv_max_m, nullptr);
}

// glowlm.models.llama.LlamaDecoderLayer.forward, step for step: returns the MLP output
// and the residual stream, which the next layer (or the final norm) adds.
namespace {

std::tuple<at::Tensor, at::Tensor> rms_layer(
    const at::Tensor& positions, const at::Tensor& x, const std::optional<at::Tensor>& residual,
    const at::Tensor& ln1_w, const Proj& qkv_p, const std::optional<at::Tensor>& q_norm_w,
    const std::optional<at::Tensor>& k_norm_w, const at::Tensor& cos_sin_cache,
    int64_t rotary_dim, bool is_neox, const Proj& o_p, const at::Tensor& ln2_w,
    const Proj& gate_up_p, const Proj& down_p, at::Tensor& kv_cache,
    const at::Tensor& block_tables, const at::Tensor& query_start_loc,
    const at::Tensor& seq_lens, const at::Tensor& slot_mapping, int64_t num_heads,
    int64_t num_kv_heads, int64_t head_size, double scale, double eps, int64_t gemv_max_m,
    const shm::Group* tp = nullptr) {
  TORCH_CHECK(x.dim() == 2, "rms_decoder_layer: x must be [tokens, hidden]");
  const int64_t M = x.size(0), qs = num_heads * head_size, kvs = num_kv_heads * head_size;
  TORCH_CHECK(qkv_p.rows() == qs + 2 * kvs,
              "rms_decoder_layer: qkv weight rows must be (heads + 2 * kv_heads) * head_size");
  TORCH_CHECK(q_norm_w.has_value() == k_norm_w.has_value(),
              "rms_decoder_layer: q and k norms come together");
  at::Tensor h, res;
  if (residual) {
    std::tie(h, res) = fused_add_rms_norm(x, *residual, ln1_w, eps);
  } else {
    res = x;
    h = rms_norm(x, ln1_w, eps);
  }
  at::Tensor qkv = qkv_p(h, gemv_max_m);
  at::Tensor q = qkv.narrow(1, 0, qs).reshape({M, num_heads, head_size});
  at::Tensor k = qkv.narrow(1, qs, kvs).reshape({M, num_kv_heads, head_size});
  at::Tensor v = qkv.narrow(1, qs + kvs, kvs).view({M, num_kv_heads, head_size});
  if (q_norm_w) {
    q = rms_norm(q, *q_norm_w, eps);
    k = rms_norm(k, *k_norm_w, eps);
  }
  std::tie(q, k) = rotary_embedding(positions, q, k, cos_sin_cache, rotary_dim, is_neox);
  write_kv(kv_cache, k, v, slot_mapping);
  at::Tensor attn =
      paged_attention(q, kv_cache, block_tables, query_start_loc, seq_lens, scale).flatten(1);
  std::tie(h, res) =
      fused_add_rms_norm(row_parallel(o_p, attn, gemv_max_m, tp), res, ln2_w, eps);
  at::Tensor up = gate_up_p(h, gemv_max_m);
  return {row_parallel(down_p, silu_and_mul(up), gemv_max_m, tp), res};
}

}  // namespace


// glowlm.models.llama.LlamaDecoderLayer.forward, step for step: returns the MLP output
// and the residual stream, which the next layer (or the final norm) adds.
std::tuple<at::Tensor, at::Tensor> rms_decoder_layer(
    const at::Tensor& positions, const at::Tensor& x, const std::optional<at::Tensor>& residual,
    const at::Tensor& ln1_w, const at::Tensor& qkv_w, const std::optional<at::Tensor>& qkv_b,
    const std::optional<at::Tensor>& q_norm_w, const std::optional<at::Tensor>& k_norm_w,
    const at::Tensor& cos_sin_cache, int64_t rotary_dim, bool is_neox, const at::Tensor& o_w,
    const std::optional<at::Tensor>& o_b, const at::Tensor& ln2_w, const at::Tensor& gate_up_w,
    const std::optional<at::Tensor>& gate_up_b, const at::Tensor& down_w,
    const std::optional<at::Tensor>& down_b, at::Tensor& kv_cache,
    const at::Tensor& block_tables, const at::Tensor& query_start_loc,
    const at::Tensor& seq_lens, const at::Tensor& slot_mapping, int64_t num_heads,
    int64_t num_kv_heads, int64_t head_size, double scale, double eps, int64_t gemv_max_m) {
  return rms_layer(positions, x, residual, ln1_w, dense(qkv_w, qkv_b), q_norm_w, k_norm_w,
                   cos_sin_cache, rotary_dim, is_neox, dense(o_w, o_b), ln2_w,
                   dense(gate_up_w, gate_up_b), dense(down_w, down_b), kv_cache, block_tables,
                   query_start_loc, seq_lens, slot_mapping, num_heads, num_kv_heads, head_size,
                   scale, eps, gemv_max_m);
}

// The stacks: every layer in one call (see glowlm.ops.fused). Weights come as one flat
// list, kLnWeights / kRmsWeights per layer in the order of the per-layer ops' arguments.
namespace {

constexpr int64_t kLnWeights = 12, kRmsWeights = 12;

at::Tensor need(const c10::List<std::optional<at::Tensor>>& w, int64_t i) {
  std::optional<at::Tensor> t = w.get(i);
  TORCH_CHECK(t.has_value(), "decoder stack: weight ", i, " is required but None");
  return *t;
}

int64_t stack_layers(const c10::List<std::optional<at::Tensor>>& w, int64_t per,
                     at::TensorList kv_caches, const char* name) {
  const int64_t n = static_cast<int64_t>(kv_caches.size());
  TORCH_CHECK(n > 0 && static_cast<int64_t>(w.size()) == n * per, name, ": ", w.size(),
              " weights for ", n, " layers, expected ", per, " per layer");
  return n;
}

}  // namespace

at::Tensor ln_decoder_stack(const at::Tensor& x_in, const c10::List<std::optional<at::Tensor>>& w,
                            at::TensorList kv_caches, const at::Tensor& block_tables,
                            const at::Tensor& query_start_loc, const at::Tensor& seq_lens,
                            const at::Tensor& slot_mapping, int64_t num_heads, double scale,
                            double eps, c10::string_view activation, int64_t gemv_max_m,
                            const std::optional<at::Tensor>& tp) {
  const int64_t layers = stack_layers(w, kLnWeights, kv_caches, "ln_decoder_stack");
  const std::optional<shm::Group> group = tp_group(tp);
  at::Tensor x = x_in;
  for (int64_t l = 0; l < layers; ++l) {
    const int64_t b = l * kLnWeights;
    at::Tensor cache = kv_caches[l];  // a handle on the same storage, written in place
    x = ln_layer(x, need(w, b), w.get(b + 1), need(w, b + 2), w.get(b + 3), need(w, b + 4),
                 w.get(b + 5), need(w, b + 6), w.get(b + 7), need(w, b + 8), w.get(b + 9),
                 need(w, b + 10), w.get(b + 11), cache, block_tables, query_start_loc,
                 seq_lens, slot_mapping, num_heads, scale, eps, activation, gemv_max_m,
                 group ? &*group : nullptr);
  }
  return x;
}

std::tuple<at::Tensor, at::Tensor> rms_decoder_stack(
    const at::Tensor& positions, const at::Tensor& x_in, const std::optional<at::Tensor>& residual,
    const c10::List<std::optional<at::Tensor>>& w, at::TensorList kv_caches,
    const at::Tensor& cos_sin_cache, int64_t rotary_dim, bool is_neox,
    const at::Tensor& block_tables, const at::Tensor& query_start_loc,
    const at::Tensor& seq_lens, const at::Tensor& slot_mapping, int64_t num_heads,
    int64_t num_kv_heads, int64_t head_size, double scale, double eps, int64_t gemv_max_m) {
  return rms_decoder_stack_q(positions, x_in, residual, w, c10::List<std::optional<at::Tensor>>(),
                             {}, kv_caches, cos_sin_cache,
                             rotary_dim, is_neox, block_tables, query_start_loc, seq_lens,
                             slot_mapping, num_heads, num_kv_heads, head_size, scale, eps,
                             gemv_max_m, std::nullopt);
}

// The stack with quantized projections: the weights list as above, with a projection's
// weight slot holding its prepared weight; for each layer's qkv, o, gate_up, down in that
// order ``quant`` holds three tensors and ``info`` (bits, param, outputs): weight-only
// (scales, zs, None; bits 4 or 8, param the group size), W8A8 (wscale, wsum, the static
// input scale as a float32 [1] or None for dynamic; bits kW8A8, param the input zero
// point), dense (None x 3; bits 0). Empty lists: every projection dense. Quantized
// decode needs this most: its weights stream 2-4x faster than bf16, so the Python
// between the ops would be an even larger share. ``tp`` (tensor-parallel shards): the
// group whose all-reduce follows each layer's o and down projections (see tp_group);
// without it the stack would have to hand every layer back to Python for its sums.
std::tuple<at::Tensor, at::Tensor> rms_decoder_stack_q(
    const at::Tensor& positions, const at::Tensor& x_in, const std::optional<at::Tensor>& residual,
    const c10::List<std::optional<at::Tensor>>& w,
    const c10::List<std::optional<at::Tensor>>& quant, at::IntArrayRef info,
    at::TensorList kv_caches, const at::Tensor& cos_sin_cache, int64_t rotary_dim,
    bool is_neox, const at::Tensor& block_tables, const at::Tensor& query_start_loc,
    const at::Tensor& seq_lens, const at::Tensor& slot_mapping, int64_t num_heads,
    int64_t num_kv_heads, int64_t head_size, double scale, double eps, int64_t gemv_max_m,
    const std::optional<at::Tensor>& tp) {
  const int64_t layers = stack_layers(w, kRmsWeights, kv_caches, "rms_decoder_stack");
  const std::optional<shm::Group> group = tp_group(tp);
  const bool quantized = !info.empty();
  TORCH_CHECK(!quantized || (static_cast<int64_t>(info.size()) == layers * 4 * 3 &&
                             static_cast<int64_t>(quant.size()) == layers * 4 * 3),
              "rms_decoder_stack_q: expected 4 x (bits, param, n) and 4 x 3 quant tensors "
              "per layer, got ", info.size(), " and ", quant.size(), " for ", layers,
              " layers");
  // Projection j (qkv, o, gate_up, down) of layer l: weight slot, bias slot.
  constexpr int64_t kSlots[4][2] = {{1, 2}, {5, 6}, {8, 9}, {10, 11}};
  auto proj = [&](int64_t l, int j) {
    const int64_t b = l * kRmsWeights;
    Proj p = dense(need(w, b + kSlots[j][0]), w.get(b + kSlots[j][1]));
    if (quantized && info[(l * 4 + j) * 3] != 0) {
      const int64_t i = (l * 4 + j) * 3;
      p.bits = info[i];
      p.param = info[i + 1];
      p.n = info[i + 2];
      p.scales = need(quant, i);
      p.zs = need(quant, i + 1);
      const std::optional<at::Tensor> in_scale = quant.get(i + 2);
      if (p.bits == kW8A8 && in_scale) p.input_scale = in_scale->item<float>();
    }
    return p;
  };
  at::Tensor x = x_in;
  std::optional<at::Tensor> res = residual;
  for (int64_t l = 0; l < layers; ++l) {
    const int64_t b = l * kRmsWeights;
    at::Tensor cache = kv_caches[l];
    auto [out, r] = rms_layer(
        positions, x, res, need(w, b), proj(l, 0), w.get(b + 3), w.get(b + 4), cos_sin_cache,
        rotary_dim, is_neox, proj(l, 1), need(w, b + 7), proj(l, 2), proj(l, 3), cache,
        block_tables, query_start_loc, seq_lens, slot_mapping, num_heads, num_kv_heads,
        head_size, scale, eps, gemv_max_m, group ? &*group : nullptr);
    x = out;
    res = r;
  }
  return {x, *res};
}

}  // namespace glowlm
