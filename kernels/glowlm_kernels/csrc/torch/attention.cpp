// Torch binding of paged attention and the KV-cache write (cpu/attention.h).
#include "cpu/attention.h"

#include <vector>

#include "torch/dispatch.h"
#include "torch/ops.h"

namespace glowlm {

using vec::kIsa;
using vec::W;

// Rows in the cache's dtype: 8-bit floats saturate at their largest finite value (as
// glowlm.attention.backend.to_cache does; torch's E5M2 cast alone would give inf).
static at::Tensor to_cache(const at::Tensor& x, at::ScalarType dtype) {
  if (dtype == at::kFloat8_e4m3fn) return x.clamp(-448.0, 448.0).to(dtype);
  if (dtype == at::kFloat8_e5m2) return x.clamp(-57344.0, 57344.0).to(dtype);
  return x.to(dtype);
}

// Elements per cached row: the head size, and an int8 row's two scale bytes.
static int64_t row_size(int64_t head_size, at::ScalarType dtype) {
  return dtype == at::kChar ? head_size + 2 : head_size;
}

void write_kv(at::Tensor& kv_cache, const at::Tensor& key, const at::Tensor& value,
              const at::Tensor& slot_mapping_in) {
  TORCH_CHECK(kv_cache.dim() == 5 && kv_cache.size(0) == 2 && kv_cache.is_contiguous(),
              "write_kv: kv_cache must be a contiguous [2, blocks, kv_heads, block, row]");
  TORCH_CHECK(key.dim() == 3 && key.sizes() == value.sizes() && key.size(1) == kv_cache.size(2)
                  && row_size(key.size(2), kv_cache.scalar_type()) == kv_cache.size(4),
              "write_kv: key/value must be [tokens, kv_heads, head_size] matching the cache");
  at::Tensor k = key.stride(2) == 1 ? key : key.contiguous();
  at::Tensor v = value.stride(2) == 1 ? value : value.contiguous();
  at::Tensor slots = slot_mapping_in.to(at::kLong).contiguous();
  const int64_t tokens = k.size(0), heads = k.size(1), hs = k.size(2);
  const int64_t bs = kv_cache.size(3), total = kv_cache.size(1) * bs;
  const int64_t* sp = slots.data_ptr<int64_t>();
  for (int64_t t = 0; t < tokens; ++t)
    TORCH_CHECK(sp[t] < total, "write_kv: slot ", sp[t], " beyond the cache's ", total);
  if (kv_cache.scalar_type() == at::kChar) {  // quantized row by row, as fp32
    at::Tensor kf = k.to(at::kFloat), vf = v.to(at::kFloat);
    kf = kf.stride(2) == 1 ? kf : kf.contiguous();
    vf = vf.stride(2) == 1 ? vf : vf.contiguous();
    cpu::write_kv_int8(kv_cache.data_ptr<int8_t>(), kv_cache.stride(0), bs,
                       kf.data_ptr<float>(), kf.stride(0), kf.stride(1), vf.data_ptr<float>(),
                       vf.stride(0), vf.stride(1), sp, tokens, heads, hs);
    return;
  }
  at::Tensor k_c = to_cache(k, kv_cache.scalar_type()), v_c = to_cache(v, kv_cache.scalar_type());
  GLOWLM_DISPATCH_KV_TYPES(kv_cache.scalar_type(), "write_kv", [&] {
    cpu::write_kv(ptr<scalar_t>(kv_cache), kv_cache.stride(0), bs, ptr<scalar_t>(k_c),
                  k_c.stride(0), k_c.stride(1), ptr<scalar_t>(v_c), v_c.stride(0),
                  v_c.stride(1), sp, tokens, heads, hs);
  });
}

at::Tensor paged_attention(const at::Tensor& query, const at::Tensor& kv_cache,
                           const at::Tensor& block_tables_in, const at::Tensor& qsl_in,
                           const at::Tensor& seq_lens_in, double scale) {
  return paged_attention_window(query, kv_cache, block_tables_in, qsl_in, seq_lens_in, scale, 0);
}

at::Tensor paged_attention_window(const at::Tensor& query, const at::Tensor& kv_cache,
                                  const at::Tensor& block_tables_in, const at::Tensor& qsl_in,
                                  const at::Tensor& seq_lens_in, double scale, int64_t window) {
  TORCH_CHECK(window >= 0, "paged_attention: window must be >= 0 (0: none)");
  TORCH_CHECK(query.dim() == 3, "paged_attention: query must be [tokens, heads, head_size]");
  TORCH_CHECK(kv_cache.dim() == 5 && kv_cache.size(0) == 2 && kv_cache.is_contiguous(),
              "paged_attention: kv_cache must be a contiguous [2, blocks, kv_heads, block, row]");
  const int64_t heads = query.size(1), kv_heads = kv_cache.size(2), hs = query.size(2);
  const int64_t rs = row_size(hs, kv_cache.scalar_type());
  TORCH_CHECK(kv_cache.size(4) == rs && heads % kv_heads == 0,
              "paged_attention: head sizes differ or heads not a multiple of kv heads");
  TORCH_CHECK(hs % W == 0, "paged_attention: head_size ", hs, " must be a multiple of ", W,
              " on ", kIsa);
  const int64_t bs = kv_cache.size(3);
  TORCH_CHECK(bs % W == 0, "paged_attention: block_size must be a multiple of ", W);
  at::Tensor tables = block_tables_in.to(at::kInt).contiguous();
  at::Tensor qsl = qsl_in.to(at::kInt).contiguous();
  at::Tensor lens = seq_lens_in.to(at::kInt).contiguous();
  const int64_t seqs = lens.numel();
  TORCH_CHECK(qsl.numel() == seqs + 1 && tables.dim() == 2 && tables.size(0) >= seqs,
              "paged_attention: query_start_loc must be [seqs + 1], block_tables [seqs, *]");
  const cpu::Geometry g{heads,         kv_heads,           heads / kv_heads,
                       hs,            bs,                 kv_heads * bs * rs,
                       kv_cache.stride(0), tables.size(1), static_cast<float>(scale),
                       window,        rs};
  const int32_t* qp = qsl.data_ptr<int32_t>();
  const int32_t* lp = lens.data_ptr<int32_t>();
  for (int64_t s = 0; s < seqs; ++s) {
    const int64_t qlen = qp[s + 1] - qp[s];
    TORCH_CHECK(qlen >= 0 && qlen <= lp[s] && (lp[s] + bs - 1) / bs <= g.max_blocks,
                "paged_attention: sequence ", s, " has inconsistent lengths");
  }
  // Decode calls this once per layer per token on a few KiB, so the query and the
  // output are converted here in plain loops rather than as ATen ops. Every output
  // row is written by exactly one task, so the fp32 output needs no zeroing.
  const at::Tensor qc = query.contiguous();
  const int64_t numel = qc.numel();
  thread_local std::vector<float> qbuf, obuf;
  const bool fp32 = query.scalar_type() == at::kFloat;
  at::Tensor out = at::empty(qc.sizes(), qc.options());
  const float* qf = fp32 ? qc.data_ptr<float>() : nullptr;
  float* of = fp32 ? out.data_ptr<float>() : nullptr;
  if (!fp32) {
    qbuf.resize(numel);
    obuf.resize(numel);
    GLOWLM_DISPATCH_FLOAT_TYPES(query.scalar_type(), "paged_attention", [&] {
      const scalar_t* src = ptr<scalar_t>(qc);
      for (int64_t i = 0; i < numel; ++i) qbuf[i] = vec::to_float(src[i]);
    });
    qf = qbuf.data();
    of = obuf.data();
  }
  GLOWLM_DISPATCH_KV_TYPES(kv_cache.scalar_type(), "paged_attention", [&] {
    cpu::paged_attention(g, qf, of, ptr<scalar_t>(kv_cache), tables.data_ptr<int32_t>(), qp,
                         lp, seqs);
  });
  if (!fp32) {
    GLOWLM_DISPATCH_FLOAT_TYPES(query.scalar_type(), "paged_attention", [&] {
      scalar_t* dst = ptr<scalar_t>(out);
      for (int64_t i = 0; i < numel; ++i) dst[i] = vec::from_float<scalar_t>(obuf[i]);
    });
  }
  return out;
}

}  // namespace glowlm
