// int8 weights x int8 activations (W8A8): w8a8_linear, and quantize_rows (the same int8
// activations for another int8 GEMM over these weights).
//
// The weights are read in a layout prepared once at load (glowlm_kernels/quant.py):
//
//   W8A8:         [N/16][K/4][16][4] int8: four consecutive columns of each of 16 rows,
//                 the operand layout of vpdpbusd (VNNI), so one instruction does 64
//                 multiply-adds into 16 int32 sums.
//
// W8A8: activations are quantized per row first (dynamic: scale = max|x| / 127;
// static: the calibrated scale and zero point), stored as u8 = q + 128 so vpdpbusd's
// unsigned x signed product applies; the +128 is removed with the precomputed row sums
// of the weights. Sums are exact int32. Without VNNI (AVX2, older AVX-512 CPUs) the same
// sums use vpmaddwd on int16-widened operands; the portable build runs plain loops.
#include "torch/quant_common.h"

namespace glowlm {
namespace {

// Quantize one row to u8 = q + 128 (K padded to kp with q = 0); returns the scale.
// Dynamic (input_scale <= 0): scale = max|x| / 127, q in [-127, 127]; static: the
// calibrated scale and zero point, q in [-128, 127].
float quantize_row(const float* x, int64_t K, int64_t kp, double input_scale, int64_t zp,
                   uint8_t* out) {
  float scale;
  if (input_scale <= 0) {
    const float amax = abs_max(x, K);
    // amax == 0: every q is 0 whatever inv is.
    quantize_values(x, K, amax > 0 ? 127.0f / amax : 127.0f, 0.f, -127.f, out);
    scale = amax > 0 ? amax / 127.0f : 1.0f;
  } else {
    quantize_values(x, K, static_cast<float>(1.0 / input_scale), static_cast<float>(zp),
                    -128.f, out);
    scale = static_cast<float>(input_scale);
  }
  // Padding columns meet zero weights; any value is exact. Use q = 0.
  for (int64_t k = K; k < kp; ++k) out[k] = 128;
  return scale;
}

// int32 sums of one 16-row block for MT token rows: acc[m][r] = sum_k xq[m][k] * w[r][k].
template <int MT>
void w8a8_block_generic(const uint8_t* xq, int64_t kp, const int8_t* w, int32_t* acc) {
  for (int m = 0; m < MT; ++m)
    for (int r = 0; r < kRows; ++r) acc[m * kRows + r] = 0;
  for (int64_t q = 0; q < kp / 4; ++q) {
    const int8_t* wq = w + q * kRows * 4;
    for (int m = 0; m < MT; ++m) {
      const uint8_t* xm = xq + m * kp + q * 4;
      for (int r = 0; r < kRows; ++r) {
        int32_t s = 0;
        for (int j = 0; j < 4; ++j) s += int32_t(xm[j]) * int32_t(wq[r * 4 + j]);
        acc[m * kRows + r] += s;
      }
    }
  }
}

#if defined(GLOWLM_QUANT_X86)
// One 16-row block for MT token rows without VNNI (AVX2, or AVX-512 CPUs without it):
// weights widened to int16 and vpmaddwd against the u8 activations widened likewise.
// Exact: |u8 * s8| <= 255 * 128 and a pair fits int32 (vpmaddubsw would saturate int16).
template <int MT>
void w8a8_block_madd(const uint8_t* xq, int64_t kp, const int8_t* w, int32_t* acc) {
  __m256i a[MT][4];
  GLOWLM_UNROLL for (int m = 0; m < MT; ++m)
    GLOWLM_UNROLL for (int j = 0; j < 4; ++j) a[m][j] = _mm256_setzero_si256();
  for (int64_t q = 0; q < kp / 4; ++q) {
    __m256i wv[4];  // rows 4j..4j+3, 4 columns each, as int16
    GLOWLM_UNROLL for (int j = 0; j < 4; ++j)
      wv[j] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(w + q * 64 + 16 * j)));
    GLOWLM_UNROLL for (int m = 0; m < MT; ++m) {
      int32_t xv;
      std::memcpy(&xv, xq + m * kp + q * 4, 4);
      const __m256i xb = _mm256_broadcastq_epi64(_mm_cvtepu8_epi16(_mm_cvtsi32_si128(xv)));
      GLOWLM_UNROLL for (int j = 0; j < 4; ++j)
        a[m][j] = _mm256_add_epi32(a[m][j], _mm256_madd_epi16(wv[j], xb));
    }
  }
  GLOWLM_UNROLL for (int m = 0; m < MT; ++m)
    GLOWLM_UNROLL for (int j = 0; j < 4; ++j) {
      alignas(32) int32_t t[8];
      _mm256_store_si256((__m256i*)t, a[m][j]);
      for (int r = 0; r < 4; ++r) acc[m * kRows + 4 * j + r] = t[2 * r] + t[2 * r + 1];
    }
}
#endif

#if defined(GLOWLM_QUANT_X86) && defined(__AVX512F__)
// MT token rows x NB blocks (block_bytes apart) with vpdpbusd: per 4 columns, one 64-byte
// weight load per block and one instruction per (token, block). No software prefetch: a
// block is one long sequential stream (16 * K bytes), and prefetching 512 or 1,024 bytes
// ahead measured the same as none (bench_quant w8a8, Ice Lake guest, 2 threads, M = 1).
template <int MT, int NB>
__attribute__((target("avx512vnni"))) void w8a8_tile_vnni(const uint8_t* xq, int64_t kp,
                                                          const int8_t* w, int64_t block_bytes,
                                                          int32_t* acc) {
  __m512i a[MT][NB];
  GLOWLM_UNROLL for (int m = 0; m < MT; ++m)
    GLOWLM_UNROLL for (int nb = 0; nb < NB; ++nb) a[m][nb] = _mm512_setzero_si512();
  for (int64_t q = 0; q < kp / 4; ++q) {
    __m512i wv[NB];
    GLOWLM_UNROLL for (int nb = 0; nb < NB; ++nb)
      wv[nb] = _mm512_loadu_si512((const void*)(w + nb * block_bytes + q * 64));
    GLOWLM_UNROLL for (int m = 0; m < MT; ++m) {
      int32_t xv;
      std::memcpy(&xv, xq + m * kp + q * 4, 4);
      const __m512i xb = _mm512_set1_epi32(xv);
      GLOWLM_UNROLL for (int nb = 0; nb < NB; ++nb)
        a[m][nb] = _mm512_dpbusd_epi32(a[m][nb], xb, wv[nb]);
    }
  }
  GLOWLM_UNROLL for (int m = 0; m < MT; ++m)
    GLOWLM_UNROLL for (int nb = 0; nb < NB; ++nb)
      _mm512_storeu_si512((void*)(acc + (m * NB + nb) * kRows), a[m][nb]);
}

// w8a8_tile_vnni for a run-time number of token rows, 1 <= mt <= 4.
template <int NB>
void w8a8_tile_vnni_rows(int mt, const uint8_t* xq, int64_t kp, const int8_t* w,
                         int64_t block_bytes, int32_t* acc) {
  switch (mt) {
    case 4: return w8a8_tile_vnni<4, NB>(xq, kp, w, block_bytes, acc);
    case 3: return w8a8_tile_vnni<3, NB>(xq, kp, w, block_bytes, acc);
    case 2: return w8a8_tile_vnni<2, NB>(xq, kp, w, block_bytes, acc);
    default: return w8a8_tile_vnni<1, NB>(xq, kp, w, block_bytes, acc);
  }
}
#endif

}  // namespace

at::Tensor w8a8_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& wscale,
                       const at::Tensor& wsum, double input_scale, int64_t input_zp, int64_t n,
                       const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2, "w8a8_linear: x must be [M, K]");
  TORCH_CHECK(weight.scalar_type() == at::kChar && weight.is_contiguous() && weight.dim() == 4 &&
                  weight.size(2) == kRows && weight.size(3) == 4,
              "w8a8_linear: weight must be int8 [N/16, K/4, 16, 4]");
  TORCH_CHECK(wscale.scalar_type() == at::kFloat && wsum.scalar_type() == at::kInt,
              "w8a8_linear: wscale float32 and wsum int32 [Npad]");
  const int64_t M = x.size(0), K = x.size(1);
  const int64_t blocks = weight.size(0), kp = weight.size(1) * 4, npad = blocks * kRows;
  TORCH_CHECK(kp >= K && kp - K < 4 && n <= npad && wscale.numel() == npad &&
                  wsum.numel() == npad,
              "w8a8_linear: weight does not match K ", K);
  at::Tensor xf = x.to(at::kFloat).contiguous();
  std::vector<uint8_t> xq(static_cast<size_t>(M * kp));
  std::vector<float> sx(static_cast<size_t>(M));
  const float* xp = xf.data_ptr<float>();
  for (int64_t m = 0; m < M; ++m)
    sx[m] = quantize_row(xp + m * K, K, kp, input_scale, input_zp, xq.data() + m * kp);
  at::Tensor out = at::empty({M, npad}, x.options().dtype(at::kFloat));
  float* o = out.data_ptr<float>();
  const int8_t* w = weight.data_ptr<int8_t>();
  const float* ws = wscale.data_ptr<float>();
  const int32_t* wsm = wsum.data_ptr<int32_t>();
  const int32_t offset = 128 + static_cast<int32_t>(input_zp);
  const int64_t block_bytes = kp * kRows;
  constexpr int NB = 4;  // blocks per work item (64 rows): independent VNNI chains
  // acc layout: [(m * nbt + nb) * 16 + r], blocks b + nb * bs.
  auto emit = [&](const int32_t* acc, int64_t m0, int mt, int64_t b, int nbt, int64_t bs) {
    for (int m = 0; m < mt; ++m)
      for (int nb = 0; nb < nbt; ++nb)
        for (int r = 0; r < kRows; ++r) {
          const int64_t row = (b + nb * bs) * kRows + r;
          const int32_t s = acc[(m * nbt + nb) * kRows + r] - offset * wsm[row];
          o[(m0 + m) * npad + row] = sx[m0 + m] * ws[row] * static_cast<float>(s);
        }
  };
#if defined(GLOWLM_QUANT_X86) && defined(__AVX512F__)
  // Decode (M <= 3) with VNNI: one tile takes all M token rows against NB blocks far
  // apart (stream_items: the blocks cut into NB parts, a work item a run of adjacent
  // positions in every part), so every weight byte is loaded once per call. The items
  // below ran one pass per token row (the later passes from L2): M = 2 reached 64-93 %
  // of a plain read on the llama-1b shapes, one pass 71-108 % (+10-20 %); M = 1 is the
  // same either way, 96-105 % (bench_quant w8a8, Ice Lake guest, 2 threads, two rounds).
  if (has_vnni() && M <= 3) {
    const uint8_t* xqp = xq.data();
    stream_items<NB>(M, blocks, [&](auto nbc, int64_t, int64_t, int64_t b, int64_t bs) {
      constexpr int nbt = decltype(nbc)::value;
      int32_t acc[3 * nbt * kRows];
      w8a8_tile_vnni_rows<nbt>(static_cast<int>(M), xqp, kp, w + b * block_bytes,
                               bs * block_bytes, acc);
      emit(acc, 0, static_cast<int>(M), b, nbt, bs);
    });
    return finish(out, n, bias, x.scalar_type());
  }
#endif
  const int64_t items = (blocks + NB - 1) / NB;
  parallel_chunks(items, [&](int64_t item) {
    int32_t acc[4 * NB * kRows];
    const int64_t b0 = item * NB, nb_here = std::min<int64_t>(NB, blocks - b0);
    for (int64_t m = 0; m < M;) {
#if defined(GLOWLM_QUANT_X86) && defined(__AVX512F__)
      if (has_vnni() && nb_here == NB) {
        const uint8_t* xm = xq.data() + m * kp;
        const int8_t* wb = w + b0 * block_bytes;
        const int mt = static_cast<int>(std::min<int64_t>(4, M - m));
        w8a8_tile_vnni_rows<NB>(mt, xm, kp, wb, block_bytes, acc);
        emit(acc, m, mt, b0, NB, 1);
        m += mt;
        continue;
      }
#endif
#if defined(GLOWLM_QUANT_X86)
      if (M - m >= 2) {
        for (int64_t b = b0; b < b0 + nb_here; ++b) {
          w8a8_block_madd<2>(xq.data() + m * kp, kp, w + b * block_bytes, acc);
          emit(acc, m, 2, b, 1, 1);
        }
        m += 2;
        continue;
      }
      for (int64_t b = b0; b < b0 + nb_here; ++b) {
        w8a8_block_madd<1>(xq.data() + m * kp, kp, w + b * block_bytes, acc);
        emit(acc, m, 1, b, 1, 1);
      }
#else
      for (int64_t b = b0; b < b0 + nb_here; ++b) {
        w8a8_block_generic<1>(xq.data() + m * kp, kp, w + b * block_bytes, acc);
        emit(acc, m, 1, b, 1, 1);
      }
#endif
      m += 1;
    }
  });
  return finish(out, n, bias, x.scalar_type());
}

// The activations of w8a8_linear as int8 values and per-row scales, for another int8
// GEMM over the same weights (the measured linear choice's torch._int_mm candidate):
// quantize_row's bytes minus 128, so the integers are exactly the ones w8a8_linear sums.
std::tuple<at::Tensor, at::Tensor> quantize_rows(const at::Tensor& x, double input_scale,
                                                 int64_t input_zp) {
  TORCH_CHECK(x.dim() == 2, "quantize_rows: x must be [M, K]");
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  const int64_t M = x.size(0), K = x.size(1);
  at::Tensor q = at::empty({M, K}, x.options().dtype(at::kChar));
  at::Tensor scale = at::empty({M, 1}, x.options().dtype(at::kFloat));
  const float* xp = xf.data_ptr<float>();
  uint8_t* qp = reinterpret_cast<uint8_t*>(q.data_ptr<int8_t>());
  float* sp = scale.data_ptr<float>();
  parallel_chunks(M, [&](int64_t m) {
    uint8_t* row = qp + m * K;
    sp[m] = quantize_row(xp + m * K, K, K, input_scale, input_zp, row);
    for (int64_t k = 0; k < K; ++k) row[k] ^= 0x80;  // u8 = q + 128 -> int8 q
  });
  return {q, scale};
}

}  // namespace glowlm
