// The operator schemas (declared once) and their CPU implementations.
//
// Every plugin's module registers the same schemas under its own namespace, given at
// build time as -DGLOWLM_OPS_NAMESPACE=glowlm_x86 (glowlm_arm, glowlm_s390x); within a
// plugin the same schemas are declared by each ISA's module (avx2, avx512, ...) and a
// process loads exactly one of them. Fake (meta) implementations live in Python (the
// plugins' kernels/ops.py) so torch.compile can trace these ops.
#include "torch/ops.h"

#ifndef GLOWLM_OPS_NAMESPACE
#error "build with -DGLOWLM_OPS_NAMESPACE=<the plugin's torch.ops namespace>"
#endif
// One level of indirection so the namespace macro expands before TORCH_LIBRARY pastes it.
#define GLOWLM_LIBRARY(ns, m) TORCH_LIBRARY(ns, m)
#define GLOWLM_LIBRARY_IMPL(ns, k, m) TORCH_LIBRARY_IMPL(ns, k, m)

GLOWLM_LIBRARY(GLOWLM_OPS_NAMESPACE, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("fused_add_rms_norm(Tensor x, Tensor residual, Tensor weight, float eps)"
        " -> (Tensor, Tensor)");
  m.def("rotary_embedding(Tensor positions, Tensor query, Tensor key, Tensor cos_sin_cache,"
        " int rotary_dim, bool is_neox) -> (Tensor, Tensor)");
  m.def("layer_norm(Tensor x, Tensor weight, Tensor? bias, float eps) -> Tensor");
  m.def("silu_and_mul(Tensor x) -> Tensor");
  m.def("gelu(Tensor x) -> Tensor");
  m.def("gelu_tanh(Tensor x) -> Tensor");
  m.def("relu(Tensor x) -> Tensor");
  m.def("gemv(Tensor x, Tensor weight, Tensor? bias) -> Tensor");
  m.def("gemm(Tensor x, Tensor weight, Tensor? bias) -> Tensor");
  m.def("fused_moe(Tensor x, Tensor w13, Tensor w2, Tensor topk_weights, Tensor topk_ids,"
        " str activation, int gemv_max_m) -> Tensor");
  m.def("lora_shrink_expand(Tensor y, Tensor x, Tensor a, Tensor b, Tensor slots,"
        " int gemv_max_m) -> Tensor");
  // The block-packed GEMM (gemm_packed.cpp): W lanes per block for the dtypes this build
  // runs (float32; bfloat16 with the pairwise bf16 dot product), else 0 (and the other
  // two refuse).
  m.def("packed_width(ScalarType dtype) -> int", &glowlm::packed_width);
  m.def("pack_blocks(Tensor weight) -> Tensor");
  // The same into a given tensor (the x86 candidate's copy in huge pages: no second copy).
  m.def("pack_blocks_into(Tensor weight, Tensor(a!) out) -> ()");
  m.def("gemm_packed(Tensor x, Tensor packed, int n, Tensor? bias) -> Tensor");
  m.def("write_kv(Tensor(a!) kv_cache, Tensor key, Tensor value, Tensor slot_mapping) -> ()");
  m.def("paged_attention(Tensor query, Tensor kv_cache, Tensor block_tables,"
        " Tensor query_start_loc, Tensor seq_lens, float scale) -> Tensor");
  m.def("paged_attention_window(Tensor query, Tensor kv_cache, Tensor block_tables,"
        " Tensor query_start_loc, Tensor seq_lens, float scale, int window) -> Tensor");
  m.def("ln_decoder_layer(Tensor x, Tensor ln1_w, Tensor? ln1_b, Tensor qkv_w, Tensor? qkv_b,"
        " Tensor out_w, Tensor? out_b, Tensor ln2_w, Tensor? ln2_b, Tensor fc1_w, Tensor? fc1_b,"
        " Tensor fc2_w, Tensor? fc2_b, Tensor(a!) kv_cache, Tensor block_tables,"
        " Tensor query_start_loc, Tensor seq_lens, Tensor slot_mapping, int num_heads,"
        " float scale, float eps, str activation, int gemv_max_m) -> Tensor");
  m.def("rms_decoder_layer(Tensor positions, Tensor x, Tensor? residual, Tensor ln1_w,"
        " Tensor qkv_w, Tensor? qkv_b, Tensor? q_norm_w, Tensor? k_norm_w,"
        " Tensor cos_sin_cache, int rotary_dim, bool is_neox, Tensor o_w, Tensor? o_b,"
        " Tensor ln2_w, Tensor gate_up_w, Tensor? gate_up_b, Tensor down_w, Tensor? down_b,"
        " Tensor(a!) kv_cache, Tensor block_tables, Tensor query_start_loc, Tensor seq_lens,"
        " Tensor slot_mapping, int num_heads, int num_kv_heads, int head_size, float scale,"
        " float eps, int gemv_max_m) -> (Tensor, Tensor)");
  // Every layer in one call: 12 weights per layer (None for absent biases / norms).
  m.def("ln_decoder_stack(Tensor x, Tensor?[] weights, Tensor(a!)[] kv_caches,"
        " Tensor block_tables, Tensor query_start_loc, Tensor seq_lens, Tensor slot_mapping,"
        " int num_heads, float scale, float eps, str activation, int gemv_max_m,"
        " Tensor? tp=None) -> Tensor");
  m.def("rms_decoder_stack(Tensor positions, Tensor x, Tensor? residual, Tensor?[] weights,"
        " Tensor(a!)[] kv_caches, Tensor cos_sin_cache, int rotary_dim, bool is_neox,"
        " Tensor block_tables, Tensor query_start_loc, Tensor seq_lens, Tensor slot_mapping,"
        " int num_heads, int num_kv_heads, int head_size, float scale, float eps,"
        " int gemv_max_m) -> (Tensor, Tensor)");
  // The same with weight-only quantized projections (fused_layer.cpp).
  m.def("rms_decoder_stack_q(Tensor positions, Tensor x, Tensor? residual, Tensor?[] weights,"
        " Tensor?[] quant, int[] info, Tensor(a!)[] kv_caches, Tensor cos_sin_cache,"
        " int rotary_dim, bool is_neox, Tensor block_tables, Tensor query_start_loc,"
        " Tensor seq_lens, Tensor slot_mapping, int num_heads, int num_kv_heads,"
        " int head_size, float scale, float eps, int gemv_max_m, Tensor? tp=None)"
        " -> (Tensor, Tensor)");
  // The shared-memory all-reduce of glowlm.distributed.shm (collective.cpp).
  m.def("shm_all_reduce(Tensor(a!) x, Tensor tp) -> ()");
  // Gemma 3's layers (gemma_layer.cpp): 15 weights per layer, its rotary table last;
  // each layer's attention window (0: none).
  m.def("gemma_decoder_stack(Tensor positions, Tensor x, Tensor? residual, Tensor?[] weights,"
        " Tensor?[] quant, int[] info, int[] windows, Tensor(a!)[] kv_caches, int rotary_dim,"
        " bool is_neox, Tensor block_tables, Tensor query_start_loc, Tensor seq_lens,"
        " Tensor slot_mapping, int num_heads, int num_kv_heads, int head_size, float scale,"
        " float eps, int gemv_max_m, Tensor? tp=None) -> (Tensor, Tensor)");
}

GLOWLM_LIBRARY_IMPL(GLOWLM_OPS_NAMESPACE, CPU, m) {
  m.impl("rms_norm", &glowlm::rms_norm);
  m.impl("fused_add_rms_norm", &glowlm::fused_add_rms_norm);
  m.impl("rotary_embedding", &glowlm::rotary_embedding);
  m.impl("layer_norm", &glowlm::layer_norm);
  m.impl("silu_and_mul", &glowlm::silu_and_mul);
  m.impl("gelu", &glowlm::gelu);
  m.impl("gelu_tanh", &glowlm::gelu_tanh);
  m.impl("relu", &glowlm::relu);
  m.impl("gemv", &glowlm::gemv);
  m.impl("gemm", &glowlm::gemm);
  m.impl("fused_moe", &glowlm::fused_moe);
  m.impl("lora_shrink_expand", &glowlm::lora_shrink_expand);
  m.impl("pack_blocks", &glowlm::pack_blocks);
  m.impl("pack_blocks_into", &glowlm::pack_blocks_into);
  m.impl("gemm_packed", &glowlm::gemm_packed);
  m.impl("write_kv", &glowlm::write_kv);
  m.impl("paged_attention", &glowlm::paged_attention);
  m.impl("paged_attention_window", &glowlm::paged_attention_window);
  m.impl("ln_decoder_layer", &glowlm::ln_decoder_layer);
  m.impl("rms_decoder_layer", &glowlm::rms_decoder_layer);
  m.impl("ln_decoder_stack", &glowlm::ln_decoder_stack);
  m.impl("rms_decoder_stack", &glowlm::rms_decoder_stack);
  m.impl("rms_decoder_stack_q", &glowlm::rms_decoder_stack_q);
  m.impl("gemma_decoder_stack", &glowlm::gemma_decoder_stack);
  m.impl("shm_all_reduce", &glowlm::shm_all_reduce);
}
