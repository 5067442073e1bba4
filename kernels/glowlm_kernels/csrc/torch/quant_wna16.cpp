// Weight-only int4 / int8 with fp32 or bf16 activations (W4A16, W8A16): wna16_linear.
//
// The weights are read in a layout prepared once at load (glowlm_kernels/quant.py) so
// that one contiguous load feeds one register of 16 output rows:
//
//   weight-only:  [N/16][K/2][16] bytes for 4 bits (low nibble: column k, high: k + 1),
//                 [N/16][K/2][2][16] bytes for 8 bits (16 rows of column k, then k + 1);
//                 unsigned values q with w = scale * (q - zero) per group of columns;
//                 scale and zero * scale as float32 or float16 [N/16][G][16], so the
//                 16 rows a block's work item computes find theirs in one sequential
//                 stream (a [G][N] layout cost a scattered pair of cache lines per
//                 group). Symmetric weights (zero = 2^(bits-1) everywhere: GPTQ/AWQ
//                 without zero points, compressed-tensors symmetric, GGUF Q4_0/Q8_0)
//                 pass no zero * scale tensor at all. Decode reads every byte once per
//                 token, so this is speed: at group 32, float32 scale and zero cost 2
//                 bits per weight, a float16 scale alone 0.5 (the loader picks float16
//                 only where it holds every scale and zero * scale exactly).
//
// Weight-only: the weights never exist in floating point in memory. Each loaded byte
// becomes fp32 in registers and is multiplied by the activation; the zero point and
// scale are applied once per group and row: y += s * (sum_k x_k q_k - zero * sum_k x_k),
// so the inner loop is convert + FMA. The same loop serves decode (1-8 token rows,
// streaming the weights once) and prefill: tokens are taken MT at a time against the
// same weight registers (a register-blocked GEMM; the block's weights stay in L1/L2
// between token tiles).
#include "torch/quant_common.h"

namespace glowlm {
namespace {

// W consecutive bytes -> fp32 (u8), or the low / high nibbles of them.
inline VecF u8_to_vec(const uint8_t* p) {
#if defined(GLOWLM_QUANT_X86) && defined(__AVX512F__)
  return {_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)p)))};
#elif defined(GLOWLM_QUANT_X86)
  return {_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)p)))};
#else
  float t[vec::W];
  for (int i = 0; i < vec::W; ++i) t[i] = static_cast<float>(p[i]);
  return vec::load(t);
#endif
}

// One 4-bit unit (W rows x 4 columns, 2W bytes: byte 2r + j holds column j in its low
// nibble and column 2 + j in its high one) -> the four columns as fp32, c[0..3].
inline void unit_to_vecs(const uint8_t* p, VecF* c) {
#if defined(GLOWLM_QUANT_X86) && defined(__AVX512F__)
  // Lane r = bytes 2r, 2r + 1: nibbles of columns 0, 2, 1, 3 at bits 0, 4, 8, 12.
  const __m512i b = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p));
  const __m512i f = _mm512_set1_epi32(15);
  c[0] = {_mm512_cvtepi32_ps(_mm512_and_si512(b, f))};
  c[2] = {_mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(b, 4), f))};
  c[1] = {_mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(b, 8), f))};
  c[3] = {_mm512_cvtepi32_ps(_mm512_srli_epi32(b, 12))};
#elif defined(GLOWLM_QUANT_X86)
  const __m256i b = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p));
  const __m256i f = _mm256_set1_epi32(15);
  c[0] = {_mm256_cvtepi32_ps(_mm256_and_si256(b, f))};
  c[2] = {_mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(b, 4), f))};
  c[1] = {_mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(b, 8), f))};
  c[3] = {_mm256_cvtepi32_ps(_mm256_srli_epi32(b, 12))};
#else
  float t[4][vec::W];
  for (int r = 0; r < vec::W; ++r)
    for (int j = 0; j < 2; ++j) {
      t[j][r] = static_cast<float>(p[2 * r + j] & 15);
      t[2 + j][r] = static_cast<float>(p[2 * r + j] >> 4);
    }
  for (int i = 0; i < 4; ++i) c[i] = vec::load(t[i]);
#endif
}

// One tile: MT token rows x NB weight blocks (NB * 16 output rows), all of K.
// x: fp32 [M][K] (row stride K); xs: per-row group sums [M][G]; out: fp32 [M][ldo].
// 4 bits: one 4-column unit per step (32 bytes of a block); 8 bits: one column pair.
template <int BITS, int MT, int NB, typename S>
void wna16_tile(const float* x, const float* xs, int64_t K, int64_t G, int64_t group,
                const uint8_t* w, const GroupScales<S>& gsc, int64_t b0, int64_t bs,
                float* out, int64_t ldo) {
  constexpr int L = NB * kVecs;                    // fp32 registers of output rows
  constexpr int kCols = BITS == 4 ? 4 : 2;         // columns per step
  constexpr int64_t kStepBytes = kCols * kRows * BITS / 8;
  const int64_t block_bytes = K * kRows * BITS / 8;
  float yv[MT][L * vec::W];
  GLOWLM_UNROLL for (int m = 0; m < MT; ++m)
    GLOWLM_UNROLL for (int l = 0; l < L; ++l) vec::store(&yv[m][l * vec::W], vec::zero());
  const int64_t steps = group / kCols;
  for (int64_t g = 0; g < G; ++g) {
    VecF acc0[MT][L], acc1[MT][L];
    GLOWLM_UNROLL for (int m = 0; m < MT; ++m)
      GLOWLM_UNROLL for (int l = 0; l < L; ++l) acc0[m][l] = acc1[m][l] = vec::zero();
    for (int64_t st = g * steps; st < (g + 1) * steps; ++st) {
      const int64_t k = st * kCols;
      VecF c[kCols][L];
      GLOWLM_UNROLL for (int nb = 0; nb < NB; ++nb) {
        const uint8_t* p = w + (b0 + nb * bs) * block_bytes + st * kStepBytes;
        GLOWLM_UNROLL for (int v = 0; v < kVecs; ++v) {
          const int l = nb * kVecs + v;
          if constexpr (BITS == 4) {
            VecF u[4];
            unit_to_vecs(p + 2 * v * vec::W, u);
            GLOWLM_UNROLL for (int i = 0; i < 4; ++i) c[i][l] = u[i];
          } else {
            c[0][l] = u8_to_vec(p + v * vec::W);
            c[1][l] = u8_to_vec(p + kRows + v * vec::W);
          }
        }
      }
      GLOWLM_UNROLL for (int m = 0; m < MT; ++m) {
        GLOWLM_UNROLL for (int i = 0; i < kCols; ++i) {
          const VecF xv = vec::broadcast(x + m * K + k + i);
          GLOWLM_UNROLL for (int l = 0; l < L; ++l) {
            if (i % 2 == 0) acc0[m][l] = vec::fmadd(xv, c[i][l], acc0[m][l]);
            else acc1[m][l] = vec::fmadd(xv, c[i][l], acc1[m][l]);
          }
        }
      }
    }
    // y += s * sum(x q) - (zero * s) * sum(x), per row of the group.
    VecF a[MT][L];
    GLOWLM_UNROLL for (int m = 0; m < MT; ++m)
      GLOWLM_UNROLL for (int l = 0; l < L; ++l) a[m][l] = vec::add(acc0[m][l], acc1[m][l]);
    gsc.template apply<MT, L>(b0, bs, g, 0.0f, a, xs, yv);
  }
  store_rows<MT, NB>(yv, b0, bs, out, ldo);
}

template <int BITS, int NB, typename S>
void wna16_rows(const float* x, const float* xs, int64_t M, int64_t K, int64_t G,
                int64_t group, const uint8_t* w, const GroupScales<S>& gsc, int64_t npad,
                int64_t b0, int64_t bs, float* out) {
  int64_t m = 0;
  for (; m + 4 <= M; m += 4)
    wna16_tile<BITS, 4, NB>(x + m * K, xs + m * G, K, G, group, w, gsc, b0, bs,
                            out + m * npad, npad);
  for (; m + 2 <= M; m += 2)
    wna16_tile<BITS, 2, NB>(x + m * K, xs + m * G, K, G, group, w, gsc, b0, bs,
                            out + m * npad, npad);
  for (; m < M; ++m)
    wna16_tile<BITS, 1, NB>(x + m * K, xs + m * G, K, G, group, w, gsc, b0, bs,
                            out + m * npad, npad);
}

template <int BITS, typename S>
void wna16_run(const float* x, const float* xs, int64_t M, int64_t K, int64_t G,
               int64_t group, const uint8_t* w, const GroupScales<S>& gsc, int64_t npad,
               float* out) {
  weight_only_items(M, npad / kRows, [&](auto nb, int64_t m0, int64_t mn, int64_t b0,
                                         int64_t bs) {
    wna16_rows<BITS, decltype(nb)::value>(x + m0 * K, xs + m0 * G, mn, K, G, group, w, gsc,
                                          npad, b0, bs, out + m0 * npad);
  });
}

#if defined(GLOWLM_VEC_BF16DOT)
// 4-bit weights x bf16 activations with the pairwise bf16 dot product (vdpbf16ps on
// AVX512_BF16). Same layout, scales and epilogue as wna16_tile; the inner loop differs:
// a unit's 32 bytes become two registers of bf16 pairs, (128 + q[r][k], 128 + q[r][k+1])
// and (.. k + 2, k + 3) (vec::nibble_units, three logic ops), and one dot2 per register
// and token row multiplies them by that row's (x[k], x[k+1]) or (x[k+2], x[k+3]) into
// all 16 rows' sums. 128 + q is exact in bf16 and every product exact in fp32, so this
// is the fp32 path's sum on the bf16 activations plus 128 * sum(x), which the epilogue
// removes with the zero point — at a third of the fp32 path's instructions per weight
// byte (it converts every nibble to fp32 and does one FMA per 16 weights, not 32).
// U accumulator sets (lo, hi of U / 2 units) keep enough dot products in flight for one
// token row (decode), where MT x NB alone gives too few dependency chains.
constexpr int64_t kQuantAhead = 2048;

template <int MT, int NB, int U, typename S>
void wna16_bf16_tile(const bf16* x, const float* xs, int64_t K, int64_t G, int64_t group,
                     const uint8_t* w, const GroupScales<S>& gsc, int64_t b0, int64_t bs,
                     float* out, int64_t ldo) {
  static_assert(U % 2 == 0, "lo and hi of each unit take one accumulator set each");
  constexpr int L = NB * kVecs;
  constexpr int64_t kUnitBytes = 2 * kRows;
  const int64_t block_bytes = K * kRows / 2;
  float yv[MT][L * vec::W];
  GLOWLM_UNROLL for (int m = 0; m < MT; ++m)
    GLOWLM_UNROLL for (int l = 0; l < L; ++l) vec::store(&yv[m][l * vec::W], vec::zero());
  const int64_t units = group / 4;
  for (int64_t g = 0; g < G; ++g) {
    VecF acc[MT][L][U];
    GLOWLM_UNROLL for (int m = 0; m < MT; ++m)
      GLOWLM_UNROLL for (int l = 0; l < L; ++l)
        GLOWLM_UNROLL for (int u = 0; u < U; ++u) acc[m][l][u] = vec::zero();
    auto unit = [&](int64_t un, int a) {  // unit un into accumulator sets a, a + 1
      vec::VecBF lo[L], hi[L];
      GLOWLM_UNROLL for (int nb = 0; nb < NB; ++nb)
        GLOWLM_UNROLL for (int v = 0; v < kVecs; ++v)
          vec::nibble_units(w + (b0 + nb * bs) * block_bytes + un * kUnitBytes + 2 * v * vec::W,
                            lo[nb * kVecs + v], hi[nb * kVecs + v]);
      GLOWLM_UNROLL for (int m = 0; m < MT; ++m) {
        const vec::VecBF x01 = vec::broadcast_pair(x + m * K + 4 * un);
        const vec::VecBF x23 = vec::broadcast_pair(x + m * K + 4 * un + 2);
        GLOWLM_UNROLL for (int l = 0; l < L; ++l) {
          acc[m][l][a] = vec::dot2(acc[m][l][a], lo[l], x01);
          acc[m][l][a + 1] = vec::dot2(acc[m][l][a + 1], hi[l], x23);
        }
      }
    };
    const int64_t u0 = g * units, u1 = u0 + units;
    GLOWLM_UNROLL for (int nb = 0; nb < NB; ++nb) gsc.prefetch(b0 + nb * bs, g + 2);
    int64_t un = u0;
    for (; un + U / 2 <= u1; un += U / 2) {
      // Each block is a short stream (K / 2 * 16 bytes: 4.6 KiB at K = 576) that the
      // hardware prefetchers barely ramp up on; ask kQuantAhead bytes ahead ourselves.
      GLOWLM_UNROLL for (int nb = 0; nb < NB; ++nb)
        vec::prefetch(w + (b0 + nb * bs) * block_bytes + un * kUnitBytes + kQuantAhead);
      GLOWLM_UNROLL for (int i = 0; i < U / 2; ++i) unit(un + i, 2 * i);
    }
    for (; un < u1; ++un) unit(un, 0);  // a group of units not divisible by U / 2
    // y += s * (sum(x (128 + q)) - (zero + 128) * sum(x)), per row of the group.
    VecF a[MT][L];
    GLOWLM_UNROLL for (int m = 0; m < MT; ++m)
      GLOWLM_UNROLL for (int l = 0; l < L; ++l) {
        a[m][l] = acc[m][l][0];
        GLOWLM_UNROLL for (int u = 1; u < U; ++u) a[m][l] = vec::add(a[m][l], acc[m][l][u]);
      }
    gsc.template apply<MT, L>(b0, bs, g, 128.0f, a, xs, yv);
  }
  store_rows<MT, NB>(yv, b0, bs, out, ldo);
}

template <int NB, typename S>
void wna16_bf16_rows(const bf16* x, const float* xs, int64_t M, int64_t K, int64_t G,
                     int64_t group, const uint8_t* w, const GroupScales<S>& gsc, int64_t npad,
                     int64_t b0, int64_t bs, float* out) {
  int64_t m = 0;
  for (; m + 4 <= M; m += 4)
    wna16_bf16_tile<4, NB, 2>(x + m * K, xs + m * G, K, G, group, w, gsc, b0, bs,
                              out + m * npad, npad);
  for (; m + 2 <= M; m += 2)
    wna16_bf16_tile<2, NB, 2>(x + m * K, xs + m * G, K, G, group, w, gsc, b0, bs,
                              out + m * npad, npad);
  for (; m < M; ++m)
    wna16_bf16_tile<1, NB, 4>(x + m * K, xs + m * G, K, G, group, w, gsc, b0, bs,
                              out + m * npad, npad);
}

template <typename S>
void wna16_bf16_run(const bf16* x, const float* xs, int64_t M, int64_t K, int64_t G,
                    int64_t group, const uint8_t* w, const GroupScales<S>& gsc, int64_t npad,
                    float* out) {
  weight_only_items(M, npad / kRows, [&](auto nb, int64_t m0, int64_t mn, int64_t b0,
                                         int64_t bs) {
    wna16_bf16_rows<decltype(nb)::value>(x + m0 * K, xs + m0 * G, mn, K, G, group, w, gsc,
                                         npad, b0, bs, out + m0 * npad);
  });
}
#endif

// xs[m, g]: the sum of row m's activations over column group g, as the kernels see them
// (vectors of W, then the group's tail; bf16 and its fp32 copy give the same sums, so the
// bf16-dot and fp32 paths subtract the same zero * sum(x)). Decode runs this on one
// thread before the kernel: a scalar loop was one dependent add per column.
template <typename T>
void group_sums(const T* x, int64_t M, int64_t K, int64_t group, float* xs) {
  const int64_t G = K / group;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t g = 0; g < G; ++g) {
      const T* p = x + m * K + g * group;
      int64_t k = 0;
      VecF acc = vec::zero();
      for (; k + vec::W <= group; k += vec::W) acc = vec::add(acc, vec::load(p + k));
      float s = vec::reduce_add(acc);
      for (; k < group; ++k) s += vec::to_float(p[k]);
      xs[m * G + g] = s;
    }
}

}  // namespace

at::Tensor wna16_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scales,
                        const at::Tensor& zs, int64_t bits, int64_t group_size, int64_t n,
                        const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2, "wna16_linear: x must be [M, K]");
  TORCH_CHECK(bits == 4 || bits == 8, "wna16_linear: bits must be 4 or 8");
  TORCH_CHECK(weight.scalar_type() == at::kByte && weight.is_contiguous(),
              "wna16_linear: weight must be contiguous uint8 (prepared layout)");
  const auto sdt = scales.scalar_type();
  const bool sym = zs.numel() == 0;
  TORCH_CHECK((sdt == at::kFloat || sdt == at::kHalf) && scales.is_contiguous() &&
                  scales.dim() == 3 && scales.size(2) == kRows &&
                  (sym || (zs.scalar_type() == sdt && zs.is_contiguous() &&
                           zs.sizes() == scales.sizes())),
              "wna16_linear: scales must be contiguous float32 or float16 [N/16, G, 16], and "
              "zs the same or empty (symmetric)");
  const int64_t M = x.size(0), K = x.size(1), G = scales.size(1), npad = scales.size(0) * kRows;
  TORCH_CHECK(group_size % (bits == 4 ? 4 : 2) == 0 && G * group_size == K, "wna16_linear: K ",
              K, " is not ", G, " groups of ", group_size, " (a multiple of ", 16 / bits, ")");
  TORCH_CHECK(npad % kRows == 0 && n <= npad && weight.numel() == npad * K * bits / 8,
              "wna16_linear: weight does not match N ", npad, " x K ", K);
  at::Tensor out = at::empty({M, npad}, x.options().dtype(at::kFloat));
  if (M == 0) return finish(out, n, bias, x.scalar_type());
  const uint8_t* w = weight.data_ptr<uint8_t>();
  std::vector<float> xs(static_cast<size_t>(M * G));
  const float zero = static_cast<float>(1 << (bits - 1));  // symmetric weights' zero point
  auto run = [&](const auto* sp) {
    using S = std::remove_const_t<std::remove_pointer_t<decltype(sp)>>;
    const GroupScales<S> gsc{sp, sym ? nullptr : static_cast<const S*>(zs.data_ptr()), zero, G};
#if defined(GLOWLM_VEC_BF16DOT)
    if (bits == 4 && x.scalar_type() == at::kBFloat16) {
      at::Tensor xb = x.contiguous();
      const bf16* xp = reinterpret_cast<const bf16*>(xb.data_ptr<at::BFloat16>());
      group_sums(xp, M, K, group_size, xs.data());
      wna16_bf16_run(xp, xs.data(), M, K, G, group_size, w, gsc, npad, out.data_ptr<float>());
      return;
    }
#endif
    at::Tensor xf = x.to(at::kFloat).contiguous();
    const float* xp = xf.data_ptr<float>();
    group_sums(xp, M, K, group_size, xs.data());
    if (bits == 4)
      wna16_run<4>(xp, xs.data(), M, K, G, group_size, w, gsc, npad, out.data_ptr<float>());
    else
      wna16_run<8>(xp, xs.data(), M, K, G, group_size, w, gsc, npad, out.data_ptr<float>());
  };
  if (sdt == at::kHalf) run(reinterpret_cast<const fp16*>(scales.data_ptr<at::Half>()));
  else run(scales.data_ptr<float>());
  return finish(out, n, bias, x.scalar_type());
}

}  // namespace glowlm
