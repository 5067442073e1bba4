// Decode rate of the quantized linear kernels against the read bandwidth of the same
// bytes, in one process (torch-free: csrc/torch/quant_*.cpp over test/aten_shim, as
// the contract driver compiles them, so this times the code the modules ship).
//
// Why: at decode every packed weight byte is read once per token, so a quantized
// kernel's figure of merit is, as the dense GEMV's (bench_gemv.cpp), the share of a
// plain read of its bytes that it reaches; a 4-bit kernel at 30 GB/s on a host that
// reads 55 GB/s is compute or latency bound, not bandwidth bound. For each llama-1b
// decode shape (N x K) and format, enough copies of the packed matrix (weights, then
// its scales / sums 64 bytes on) to exceed the last-level cache many times, in 2 MiB
// pages (test/bench_util.h), timed round-robin per repetition:
//   read          a plain read of the packed bytes (all threads, parallel_chunks);
//   w4 bf16dot    wna16_linear, 4 bits, symmetric, group 128, float16 scales (the
//                 compressed-tensors W4A16 layout after packing), bf16 x: the pairwise
//                 bf16 dot-product tile (AVX512_BF16 / Arm BF16 builds only);
//   w4 f32        the same weights, fp32 x: the fp32 tile (every ISA);
//   w8 ...        wna16_linear, 8 bits, symmetric, group 128, float16 scales, bf16 x;
//   w8a8 ...      w8a8_linear, dynamic per-token activation scale, bf16 x (vpdpbusd
//                 with AVX512_VNNI),
//   w4 a8         the same weights through wna8_linear: int8 activations per 32
//                 columns (what W4A16 layers run by default where vpmaddubsw is
//                 the fast path: the avx2 and avx512 modules);
//   gguf4/gguf8   (not by default) 4 / 8 bits in groups of 32, the bf16-x (or fp32-x)
//                 tile against wna8_linear ("a8": int8 activations per 32 columns),
// at M = 1 and 4 token rows (W8A8 also 2), each a whole op call (x conversion /
// quantization, group sums, output) as the engine makes it. GB/s counts the packed
// bytes (weights + scales).
//
// Built and run by tools/x86/bench_linear.py --native ISA --program quant;
// OMP_NUM_THREADS sets the threads (default: all cores).
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "test/bench_util.h"  // timing, read bandwidth, 2 MiB-page copies (shared)
#include "torch/quant_wna16.cpp"  // the kernels, over test/aten_shim
#include "torch/quant_wna8.cpp"
#include "torch/quant_w8a8.cpp"
#include "torch/quant_registration.cpp"

namespace {

using namespace glowlm;
using namespace glowlm::bench;

constexpr int64_t kGroup = 128;
constexpr int64_t kMaxM = 4;

int64_t align64(int64_t n) { return (n + 63) / 64 * 64; }

// Activations: kMaxM rows of K, bf16 and fp32 (the same values).
struct Activations {
  at::Tensor bf[kMaxM + 1], f32[kMaxM + 1];  // by M
  Activations(int64_t K, std::mt19937& gen) {
    std::normal_distribution<float> unit(0.0f, 1.0f);
    std::vector<float> v(kMaxM * K);
    for (float& f : v) f = unit(gen);
    for (int64_t M : {int64_t{1}, int64_t{2}, kMaxM}) {
      bf[M] = at::empty({M, K}, {at::kBFloat16});
      f32[M] = at::empty({M, K}, {at::kFloat});
      for (int64_t i = 0; i < M * K; ++i) {
        bf[M].set(i, v[i]);
        f32[M].set(i, bf[M].get(i));  // the bf16 values: both paths see the same x
      }
    }
  }
};

// Weight-only, `bits` bits, symmetric (no zero * scale), float16 scales [N/16][G][16];
// gguf: groups of 32 (GGUF's Q4_0 / Q8_0), and wna8_linear (int8 activations per 32
// columns) beside wna16_linear on the same bytes (random bytes are valid in either
// 8-bit layout).
void bench_weight_only(int bits, int64_t N, int64_t K, int reps, int64_t min_bytes,
                       const Activations& xs, bool gguf = false) {
  const int64_t kGroup = gguf ? 32 : ::kGroup;
  const int64_t G = K / kGroup, wbytes = N * K * bits / 8, soff = align64(wbytes);
  const int64_t bytes = soff + N * G * 2;
  std::mt19937 gen(1);
  const Copies mats(bytes, min_bytes, [&](char* p) {
    for (int64_t i = 0; i < wbytes; ++i) p[i] = static_cast<char>(gen());
    fp16* s = reinterpret_cast<fp16*>(p + soff);
    for (int64_t i = 0; i < N * G; ++i) s[i] = vec::from_float<fp16>(0.01f + 1e-5f * (gen() % 64));
  });
  const at::Tensor zs = at::empty({0}, {at::kHalf});
  auto call = [&, bits, N, K, G](const char* p, const at::Tensor& x) {
    char* q = const_cast<char*>(p);
    const at::Tensor w = at::Tensor::view(q, {wbytes}, at::kByte);
    const at::Tensor s = at::Tensor::view(q + soff, {N / 16, G, 16}, at::kHalf);
    wna16_linear(x, w, s, zs, bits, kGroup, N, std::nullopt);
  };
  auto call8 = [&, bits, N, K, G](const char* p, const at::Tensor& x) {
    char* q = const_cast<char*>(p);
    const at::Tensor w = at::Tensor::view(q, {wbytes}, bits == 8 ? at::kChar : at::kByte);
    const at::Tensor s = at::Tensor::view(q + soff, {N / 16, G, 16}, at::kHalf);
    wna8_linear(x, w, s, zs, bits, kGroup, N, std::nullopt);
  };
  std::vector<Config> configs;
  for (int64_t M : {int64_t{1}, kMaxM}) {
    const std::string m = " M=" + std::to_string(M);
#if defined(GLOWLM_VEC_BF16DOT)
    if (bits == 4) configs.push_back({"bf16dot" + m, [&, M](const char* p) { call(p, xs.bf[M]); }, {}});
#endif
    if (bits == 4) configs.push_back({"f32" + m, [&, M](const char* p) { call(p, xs.f32[M]); }, {}});
    else configs.push_back({"bf16 x" + m, [&, M](const char* p) { call(p, xs.bf[M]); }, {}});
    if (gguf || bits == 4) configs.push_back({"a8" + m, [&, M](const char* p) { call8(p, xs.bf[M]); }, {}});
  }
  run_round_robin(gguf ? (bits == 4 ? "w4g32" : "w8g32") : (bits == 4 ? "w4g128" : "w8g128"),
                  N, K, mats, std::move(configs), reps);
}

// W8A8: int8 [N/16][K/4][16][4], then float32 wscale [N] and int32 wsum [N].
void bench_w8a8(int64_t N, int64_t K, int reps, int64_t min_bytes, const Activations& xs) {
  const int64_t wbytes = N * K, soff = align64(wbytes), moff = soff + align64(N * 4);
  const int64_t bytes = moff + N * 4;
  std::mt19937 gen(2);
  const Copies mats(bytes, min_bytes, [&](char* p) {
    for (int64_t i = 0; i < wbytes; ++i) p[i] = static_cast<char>(gen());
    float* s = reinterpret_cast<float*>(p + soff);
    int32_t* sum = reinterpret_cast<int32_t*>(p + moff);
    for (int64_t i = 0; i < N; ++i) {
      s[i] = 1e-3f;
      sum[i] = 0;
    }
  });
  auto call = [&, N, K](const char* p, const at::Tensor& x) {
    char* q = const_cast<char*>(p);
    w8a8_linear(x, at::Tensor::view(q, {N / 16, K / 4, 16, 4}, at::kChar),
                at::Tensor::view(q + soff, {N}, at::kFloat),
                at::Tensor::view(q + moff, {N}, at::kInt), 0.0, 0, N, std::nullopt);
  };
  std::vector<Config> configs;
  for (int64_t M : {int64_t{1}, int64_t{2}, kMaxM})  // 2: two sequences decoding
    configs.push_back({"bf16 x M=" + std::to_string(M),
                       [&, M](const char* p) { call(p, xs.bf[M]); }, {}});
  run_round_robin("w8a8", N, K, mats, std::move(configs), reps);
}

}  // namespace

int main(int argc, char** argv) {
  // q/o, k/v, fused qkv, gate|up, down of llama-1b (hidden 2048, intermediate 8192).
  const BenchArgs args = parse_bench_args(
      argc, argv, "--formats", "w4,w8,w8a8",
      {{2048, 2048}, {512, 2048}, {3072, 2048}, {16384, 2048}, {2048, 8192}});
  for (const auto& [N, K] : args.shapes) {
    std::mt19937 gen(0);
    const Activations xs(K, gen);
    const int64_t min_bytes = args.min_mib << 20;
    if (args.has("w4")) bench_weight_only(4, N, K, args.reps, min_bytes, xs);
    if (args.has("w8")) bench_weight_only(8, N, K, args.reps, min_bytes, xs);
    if (args.has("w8a8")) bench_w8a8(N, K, args.reps, min_bytes, xs);
    if (args.has("gguf4")) bench_weight_only(4, N, K, args.reps, min_bytes, xs, true);
    if (args.has("gguf8")) bench_weight_only(8, N, K, args.reps, min_bytes, xs, true);
  }
  return 0;
}
