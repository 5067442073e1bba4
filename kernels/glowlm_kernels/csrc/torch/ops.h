// Declarations of the CPU implementations registered in registration.cpp (and, through
// torch/quant_ops.h, of the quantized ones registered in quant_registration.cpp).
#pragma once

#include <torch/all.h>

#include <optional>
#include <string>
#include <tuple>

#include "torch/quant_ops.h"

namespace glowlm {

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm(const at::Tensor& x,
                                                      const at::Tensor& residual,
                                                      const at::Tensor& weight, double eps);
std::tuple<at::Tensor, at::Tensor> rotary_embedding(const at::Tensor& positions,
                                                    const at::Tensor& query,
                                                    const at::Tensor& key,
                                                    const at::Tensor& cos_sin_cache,
                                                    int64_t rotary_dim, bool is_neox);
at::Tensor layer_norm(const at::Tensor& x, const at::Tensor& weight,
                      const std::optional<at::Tensor>& bias, double eps);
// (norm(x + residual), x + residual) with the sum rounded to x's dtype first.
std::tuple<at::Tensor, at::Tensor> add_layer_norm(const at::Tensor& x, const at::Tensor& residual,
                                                  const at::Tensor& weight,
                                                  const std::optional<at::Tensor>& bias,
                                                  double eps);
// x + y rounded to their dtype, in one thread (decode-sized rows; not a registered op).
at::Tensor residual_add(const at::Tensor& x, const at::Tensor& y);
at::Tensor silu_and_mul(const at::Tensor& x);
at::Tensor gelu(const at::Tensor& x);
at::Tensor gelu_tanh(const at::Tensor& x);
at::Tensor relu(const at::Tensor& x);
at::Tensor gemv(const at::Tensor& x, const at::Tensor& weight,
                const std::optional<at::Tensor>& bias);
at::Tensor gemm(const at::Tensor& x, const at::Tensor& weight,
                const std::optional<at::Tensor>& bias);
// lora.cpp: LoRA adapters' updates on their rows after a linear layer's base matmul.
at::Tensor lora_shrink_expand(const at::Tensor& y, const at::Tensor& x, const at::Tensor& a,
                              const at::Tensor& b, const at::Tensor& slots,
                              int64_t gemv_max_m);

// moe.cpp: a mixture-of-experts layer's routed experts, grouped by expert.
at::Tensor fused_moe(const at::Tensor& x, const at::Tensor& w13, const at::Tensor& w2,
                     const at::Tensor& topk_weights, const at::Tensor& topk_ids,
                     const std::string& activation, int64_t gemv_max_m);
// gemm_packed.cpp: the block-packed GEMM (fp32; bf16 with a bf16 dot product).
int64_t packed_width(at::ScalarType dtype);
at::Tensor pack_blocks(const at::Tensor& weight);
void pack_blocks_into(const at::Tensor& weight, at::Tensor& out);
at::Tensor gemm_packed(const at::Tensor& x, const at::Tensor& packed, int64_t n,
                       const std::optional<at::Tensor>& bias);
void write_kv(at::Tensor& kv_cache, const at::Tensor& key, const at::Tensor& value,
              const at::Tensor& slot_mapping);
at::Tensor paged_attention(const at::Tensor& query, const at::Tensor& kv_cache,
                           const at::Tensor& block_tables, const at::Tensor& query_start_loc,
                           const at::Tensor& seq_lens, double scale);
// The same attending only the last `window` keys of each query (0: all; not a registered
// op: Gemma 3's local layers in gemma_layer.cpp).
at::Tensor paged_attention_window(const at::Tensor& query, const at::Tensor& kv_cache,
                                  const at::Tensor& block_tables, const at::Tensor& query_start_loc,
                                  const at::Tensor& seq_lens, double scale, int64_t window);
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
                            c10::string_view activation, int64_t gemv_max_m);
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
    int64_t num_kv_heads, int64_t head_size, double scale, double eps, int64_t gemv_max_m);

at::Tensor ln_decoder_stack(const at::Tensor& x, const c10::List<std::optional<at::Tensor>>& w,
                            at::TensorList kv_caches, const at::Tensor& block_tables,
                            const at::Tensor& query_start_loc, const at::Tensor& seq_lens,
                            const at::Tensor& slot_mapping, int64_t num_heads, double scale,
                            double eps, c10::string_view activation, int64_t gemv_max_m,
                            const std::optional<at::Tensor>& tp);
std::tuple<at::Tensor, at::Tensor> rms_decoder_stack(
    const at::Tensor& positions, const at::Tensor& x, const std::optional<at::Tensor>& residual,
    const c10::List<std::optional<at::Tensor>>& w, at::TensorList kv_caches,
    const at::Tensor& cos_sin_cache, int64_t rotary_dim, bool is_neox,
    const at::Tensor& block_tables, const at::Tensor& query_start_loc,
    const at::Tensor& seq_lens, const at::Tensor& slot_mapping, int64_t num_heads,
    int64_t num_kv_heads, int64_t head_size, double scale, double eps, int64_t gemv_max_m);
std::tuple<at::Tensor, at::Tensor> rms_decoder_stack_q(
    const at::Tensor& positions, const at::Tensor& x, const std::optional<at::Tensor>& residual,
    const c10::List<std::optional<at::Tensor>>& w,
    const c10::List<std::optional<at::Tensor>>& quant, at::IntArrayRef info,
    at::TensorList kv_caches, const at::Tensor& cos_sin_cache, int64_t rotary_dim,
    bool is_neox, const at::Tensor& block_tables, const at::Tensor& query_start_loc,
    const at::Tensor& seq_lens, const at::Tensor& slot_mapping, int64_t num_heads,
    int64_t num_kv_heads, int64_t head_size, double scale, double eps, int64_t gemv_max_m,
    const std::optional<at::Tensor>& tp);
// gemma_layer.cpp: Gemma 3's layers (four norms, GeGLU, a rotary table per layer).
std::tuple<at::Tensor, at::Tensor> gemma_decoder_stack(
    const at::Tensor& positions, const at::Tensor& x, const std::optional<at::Tensor>& residual,
    const c10::List<std::optional<at::Tensor>>& w,
    const c10::List<std::optional<at::Tensor>>& quant, at::IntArrayRef info,
    at::IntArrayRef windows, at::TensorList kv_caches, int64_t rotary_dim, bool is_neox,
    const at::Tensor& block_tables, const at::Tensor& query_start_loc,
    const at::Tensor& seq_lens, const at::Tensor& slot_mapping, int64_t num_heads,
    int64_t num_kv_heads, int64_t head_size, double scale, double eps, int64_t gemv_max_m,
    const std::optional<at::Tensor>& tp);
// collective.cpp: the shared-memory all-reduce the tensor-parallel stacks run.
void shm_all_reduce(at::Tensor& x, const at::Tensor& tp);
// The quantized linear ops are declared in torch/quant_ops.h (included above).

}  // namespace glowlm
