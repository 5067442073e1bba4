// Paged attention (torch-free) over the KV cache [2, num_blocks, num_kv_heads, block_size, row]
// (row = head_size, or head_size + 2 in an int8 cache: the values, then the row's fp16 scale).
//
// One kernel serves decode and (chunked) prefill: sequence i's new tokens are
// query rows query_start_loc[i]..query_start_loc[i+1], and query j of a chunk of
// qlen tokens attends keys 0 .. ctx - qlen + j (causal, continuing a prefix), or with a
// window w only the last w of them (keys p with q - w < p <= q: Gemma 3's local layers;
// blocks wholly before every query's window are not read).
// A task is (sequence, kv head, tile of up to kQTile queries); it processes the
// whole GQA group of query heads sharing that kv head, so every K/V block is
// read once per task. Scores, an online softmax (running max and sum, fp32) and P.V
// run block by block. A bf16/fp16 block is read directly (converted in registers)
// when few query rows share it, as in decode; with more rows (prefill) it is first
// converted to fp32 once into a scratch buffer, so each element is converted once
// rather than once per row. Scores are computed W keys at a time (W accumulators
// finished by one transposed sum rather than W horizontal reductions) and P.V keeps
// up to 8 output vectors in registers per pass: -15 % decode attention time on the
// llama-1b and opt-125m shapes (1 thread, 192 and 2048 keys).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "cpu/parallel.h"
#include "cpu/vec.h"

namespace glowlm::cpu {

using namespace glowlm::vec;

constexpr int64_t kQTile = 16;
constexpr int64_t kDirectRows = 8;  // up to this many query rows read a block unconverted
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct Task {
  int64_t seq, kv_head, q_begin, q_end;
};

struct Geometry {
  int64_t num_heads, num_kv_heads, group, head_size, block_size, block_stride, kv_stride,
      max_blocks;
  float scale;  // applied to q.k here, so the query needs no scaled copy
  int64_t window = 0;  // > 0: a query at position q sees keys p with q - window < p <= q
  int64_t row = 0;     // elements per cached row: head_size (0) or head_size + 2 (int8)
  int64_t row_size() const { return row > 0 ? row : head_size; }
};

// An int8 cache row: head_size values round(x / s) in [-127, 127], then s in two bytes as
// fp16, s = amax|x| / 127 rounded to fp16 and x divided by that rounded s, in fp32 and
// rounding half to even: the bytes glowlm.attention.backend.quantize_int8_rows writes.
// An all-zero row stores s = 0 and zeros.
inline void quantize_row_int8(const float* x, int64_t hs, int8_t* dst) {
  float amax = 0.0f;
  for (int64_t i = 0; i < hs; ++i) amax = std::max(amax, std::fabs(x[i]));
  const fp16 sh = from_float<fp16>(amax / 127.0f);
  const float s = to_float(sh);
  for (int64_t i = 0; i < hs; ++i) {
    const float q = s > 0.0f ? std::nearbyint(x[i] / s) : 0.0f;
    dst[i] = static_cast<int8_t>(std::min(127.0f, std::max(-127.0f, q)));
  }
  std::memcpy(dst + hs, &sh, sizeof(sh));
}

// Query rows up to which a block of C is read directly (widened in registers by every
// row) rather than widened once into fp32 scratch. E4M3 costs more to widen than to
// re-read as fp32 from L1/L2, so a GQA group of rows widens it once; measured on the
// llama-1b decode shape (group 4, 16 k keys, AVX512_BF16 Xeon, 2 threads): direct
// 5.1 ms, scratch 3.2 ms; E5M2 (fp16's top byte) widens as cheaply as bf16: direct 3.0 ms,
// scratch 3.2 ms (bf16 2.4-2.9 ms).
// An int8 block always goes through scratch: its rows carry a scale each, which the
// direct path's loads do not apply.
template <typename C>
constexpr int64_t direct_rows() {
  if constexpr (std::is_same_v<C, int8_t>) return 0;
  return std::is_same_v<C, fp8e4m3> ? 1 : kDirectRows;
}

// n rows of hs values (rows rs elements apart in the cache) as fp32 [n, hs]: the cache
// itself for fp32, else widened into scratch; int8 rows times their scale.
template <typename C>
const float* block_as_float(const C* src, int64_t n, int64_t hs, int64_t rs, float* scratch) {
  if constexpr (std::is_same_v<C, float>) {
    return src;
  } else if constexpr (std::is_same_v<C, int8_t>) {
    for (int64_t t = 0; t < n; ++t) {
      const int8_t* r = src + t * rs;
      fp16 sh;
      std::memcpy(&sh, r + hs, sizeof(sh));
      const VecF s = set1(to_float(sh));
      for (int64_t i = 0; i < hs; i += W) store(scratch + t * hs + i, mul(load(r + i), s));
    }
    return scratch;
  } else {
    for (int64_t i = 0; i < n * hs; i += W) store(scratch + i, load(src + i));
    return scratch;
  }
}

// NV: head_size / W when known at compile time (lets the compiler unroll), else 0.
template <typename C, int NV>
void attend(const Task& task, const Geometry& g, const float* q, float* out, const C* cache,
            const int32_t* tables, const int32_t* qsl, const int32_t* seq_lens) {
  const int64_t hs = g.head_size, bs = g.block_size, rs = g.row_size();
  const int nv = NV ? NV : static_cast<int>(hs / W);
  const int64_t tok0 = qsl[task.seq], qlen = qsl[task.seq + 1] - tok0;
  const int64_t ctx = seq_lens[task.seq];
  const int64_t rows = (task.q_end - task.q_begin) * g.group;
  const int64_t max_keys = ctx - qlen + task.q_end;
  // The first key any row of the task sees (its first query's window start).
  const int64_t first_key =
      g.window > 0 ? std::max<int64_t>(0, ctx - qlen + task.q_begin - g.window + 1) : 0;
  std::vector<float> acc(rows * hs, 0.0f), m(rows, kNegInf), l(rows, 0.0f);
  std::vector<float> scores(rows * bs);
  std::vector<float> kbuf(rows <= direct_rows<C>() ? 0 : bs * hs), vbuf(kbuf.size());
  auto row_q = [&](int64_t r) {  // row r = (query j, head g) -> its [hs] query vector
    const int64_t j = task.q_begin + r / g.group, h = task.kv_head * g.group + r % g.group;
    return q + ((tok0 + j) * g.num_heads + h) * hs;
  };
  const int32_t* table = tables + task.seq * g.max_blocks;
  // One block of keys/values (kf, vf: fp32 scratch or the cache itself) for every row.
  // next_k: the next block's keys in the cache, or null. While the first row reads the
  // keys it prefetches the values, and while it reads the values the next keys: the
  // blocks are a few KiB of DRAM each, too short for the hardware prefetchers to ramp up.
  auto block = [&](int64_t b, int64_t n, const auto* kf, const auto* vf, const C* next_k) {
    constexpr int64_t elem = static_cast<int64_t>(sizeof(*kf));
    // Scratch blocks (prefill, converted to fp32) are in L1/L2 already: nothing to fetch.
    constexpr bool in_cache = std::is_same_v<std::decay_t<decltype(*vf)>, C>;
    for (int64_t r = 0; r < rows; ++r) {
      const float* qr = row_q(r);
      const int64_t limit = ctx - qlen + task.q_begin + r / g.group + 1 - b * bs;  // keys seen
      const int64_t nr = std::min(n, limit);
      // Keys of this block before the row's window (none without a window).
      const int64_t t0 = g.window > 0 ? std::max<int64_t>(0, limit - g.window) : 0;
      float* s = scores.data() + r * bs;
      if (nr <= t0) continue;
      float block_max = kNegInf;
      int64_t t = t0;
      for (; t + W <= nr; t += W) {  // W keys at once: W accumulators, one transposed sum
        if (in_cache && r == 0) prefetch_range(vf + t * hs, W * hs * elem);
        VecF d[W];
        GLOWLM_UNROLL for (int j = 0; j < W; ++j) d[j] = zero();
        for (int v = 0; v < nv; ++v) {
          const VecF qv = load(qr + v * W);
          GLOWLM_UNROLL for (int j = 0; j < W; ++j)
            d[j] = fmadd(qv, load(kf + (t + j) * hs + v * W), d[j]);
        }
        const VecF sc = mul(transpose_sum(d), set1(g.scale));
        store(s + t, sc);
        block_max = std::max(block_max, reduce_max(sc));
      }
      for (; t < nr; ++t) {
        VecF d = zero();
        for (int v = 0; v < nv; ++v) d = fmadd(load(qr + v * W), load(kf + t * hs + v * W), d);
        s[t] = reduce_add(d) * g.scale;
        block_max = std::max(block_max, s[t]);
      }
      const float m_new = std::max(m[r], block_max);
      const float alpha = std::exp(m[r] - m_new);  // exp(-inf) = 0 on the first block
      t = t0;
      float sum = 0.0f;
      VecF vm = set1(m_new), vsum = zero();
      for (; t + W <= nr; t += W) {
        VecF p = exp(sub(load(s + t), vm));
        store(s + t, p);
        vsum = add(vsum, p);
      }
      for (; t < nr; ++t) {
        s[t] = std::exp(s[t] - m_new);
        sum += s[t];
      }
      l[r] = l[r] * alpha + sum + reduce_add(vsum);
      m[r] = m_new;
      float* a = acc.data() + r * hs;
      VecF valpha = set1(alpha);
      for (int v0 = 0; v0 < nv; v0 += 8) {  // 8 accumulators in registers per pass over P
        const int cnt = std::min(8, nv - v0);
        VecF av[8];
        for (int j = 0; j < cnt; ++j) av[j] = mul(load(a + (v0 + j) * W), valpha);
        for (int64_t tt = t0; tt < nr; ++tt) {
          if (r == 0 && v0 == 0 && next_k) prefetch_range(next_k + tt * hs, hs * sizeof(C));
          VecF p = set1(s[tt]);
          const auto* vr = vf + tt * hs + v0 * W;
          for (int j = 0; j < cnt; ++j) av[j] = fmadd(p, load(vr + j * W), av[j]);
        }
        for (int j = 0; j < cnt; ++j) store(a + (v0 + j) * W, av[j]);
      }
    }
  };
  const bool direct = rows <= direct_rows<C>();
  for (int64_t b = first_key / bs; b * bs < max_keys; ++b) {
    const int64_t n = std::min(bs, max_keys - b * bs);
    const C* base = cache + table[b] * g.block_stride + task.kv_head * bs * rs;
    const C* next_k = (b + 1) * bs < max_keys
                          ? cache + table[b + 1] * g.block_stride + task.kv_head * bs * rs
                          : nullptr;
    if (direct) {
      block(b, n, base, base + g.kv_stride, next_k);
    } else {
      block(b, n, block_as_float(base, n, hs, rs, kbuf.data()),
            block_as_float(base + g.kv_stride, n, hs, rs, vbuf.data()), nullptr);
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t j = task.q_begin + r / g.group, h = task.kv_head * g.group + r % g.group;
    float* o = out + ((tok0 + j) * g.num_heads + h) * hs;
    VecF inv = set1(1.0f / l[r]);
    for (int v = 0; v < nv; ++v) store(o + v * W, mul(load(acc.data() + r * hs + v * W), inv));
  }
}

template <typename C>
void run_tasks(const std::vector<Task>& tasks, const Geometry& g, const float* q, float* out,
               const C* cache, const int32_t* tables, const int32_t* qsl, const int32_t* lens) {
  parallel_chunks(static_cast<int64_t>(tasks.size()), [&](int64_t i) {
    const Task& t = tasks[i];
    switch (g.head_size / W) {
#define GLOWLM_NV_CASE(N)                                 \
  case N:                                                 \
    attend<C, N>(t, g, q, out, cache, tables, qsl, lens); \
    break;
      GLOWLM_NV_CASE(4)
      GLOWLM_NV_CASE(5)
      GLOWLM_NV_CASE(6)
      GLOWLM_NV_CASE(8)
      GLOWLM_NV_CASE(10)
      GLOWLM_NV_CASE(12)
      GLOWLM_NV_CASE(16)
#undef GLOWLM_NV_CASE
      default:
        attend<C, 0>(t, g, q, out, cache, tables, qsl, lens);
    }
  });
}

// Stores key/value rows ([tokens, heads, hs], row strides ks/vs per token and kh/vh per
// head, already in the cache dtype) at slots[t] of the cache (K half at cache, V half
// kv_stride elements later; blocks of bs slots). Negative slots (padding) are skipped;
// the caller checks slots < blocks * bs.
template <typename T>
void write_kv(T* cache, int64_t kv_stride, int64_t bs, const T* k, int64_t ks, int64_t kh,
              const T* v, int64_t vs, int64_t vh, const int64_t* slots, int64_t tokens,
              int64_t heads, int64_t hs) {
  parallel_for(0, tokens * heads, 64, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const int64_t t = i / heads, h = i % heads, slot = slots[t];
      if (slot < 0) continue;  // padding token: nothing to store
      const int64_t blk = slot / bs, off = slot % bs;
      T* dst = cache + ((blk * heads + h) * bs + off) * hs;
      std::memcpy(dst, k + t * ks + h * kh, hs * sizeof(T));
      std::memcpy(dst + kv_stride, v + t * vs + h * vh, hs * sizeof(T));
    }
  });
}

// write_kv for an int8 cache: fp32 key/value rows ([tokens, heads, hs], strides as above)
// quantized by quantize_row_int8 into rows of hs + 2 bytes at slots[t].
inline void write_kv_int8(int8_t* cache, int64_t kv_stride, int64_t bs, const float* k,
                          int64_t ks, int64_t kh, const float* v, int64_t vs, int64_t vh,
                          const int64_t* slots, int64_t tokens, int64_t heads, int64_t hs) {
  const int64_t rs = hs + 2;
  parallel_for(0, tokens * heads, 64, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const int64_t t = i / heads, h = i % heads, slot = slots[t];
      if (slot < 0) continue;  // padding token: nothing to store
      const int64_t blk = slot / bs, off = slot % bs;
      int8_t* dst = cache + ((blk * heads + h) * bs + off) * rs;
      quantize_row_int8(k + t * ks + h * kh, hs, dst);
      quantize_row_int8(v + t * vs + h * vh, hs, dst + kv_stride);
    }
  });
}

// out = attention of q (fp32 [tokens, heads, hs]) over the paged cache for `seqs`
// sequences; qsl / lens / tables as in AttentionMetadata (int32), already checked.
template <typename C>
void paged_attention(const Geometry& g, const float* q, float* out, const C* cache,
                     const int32_t* tables, const int32_t* qsl, const int32_t* lens,
                     int64_t seqs) {
  std::vector<Task> tasks;
  for (int64_t s = 0; s < seqs; ++s) {
    const int64_t qlen = qsl[s + 1] - qsl[s];
    for (int64_t h = 0; h < g.num_kv_heads; ++h)
      for (int64_t j = 0; j < qlen; j += kQTile)
        tasks.push_back({s, h, j, std::min(qlen, j + kQTile)});
  }
  run_tasks<C>(tasks, g, q, out, cache, tables, qsl, lens);
}

}  // namespace glowlm::cpu
