// Contract test driver for the torch-free kernels: runs each op on inputs written by
// the host (core's reference ops computed the expected outputs) and compares.
//
// Why: the kernels of other CPU families (aarch64 NEON / NEON+BF16, s390x z14/z15) are
// tested here under qemu-user, where Python and torch do not run. The host writes a
// text case file (glowlm's tests/cross/test_cross_kernels.py), this driver is
// cross-compiled with the variant's flags and run under emulation:
//
//   case <name> <op> <dtype of x> <dtype of weights / cache> <atol> <rtol>
//   i <key> <int>          f <key> <float>          a <key> <count> <values...>
//   end
//
// Values are decimal floats (exact for the dtype: the host rounded them), so the file
// is the same on little- and big-endian targets. Output: one line per case, then
// "summary <passed> <failed>"; the exit status is 1 if any case failed.
//
// The quantized linear kernels (wna16_linear: 4/8-bit weight-only, with the pairwise
// bf16 dot product where vec.h has GLOWLM_VEC_BF16DOT; wna8_linear; w8a8_linear) are
// still written inside their torch binding, csrc/torch/quant_*.cpp (one file per tile
// family): the driver compiles those files itself against the small ATen subset in
// test/aten_shim (its build puts that directory on the include path) and calls the same
// C++ entry points the torch ops register.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu/attention.h"
#include "cpu/gemm.h"
#include "cpu/gemv.h"
#include "cpu/lora.h"
#include "cpu/norm_act.h"
#include "cpu/rotary.h"
// The quantized kernels over test/aten_shim: glowlm_kernels.build.QUANT_SOURCES.
#include "torch/quant_wna16.cpp"
#include "torch/quant_wna8.cpp"
#include "torch/quant_w8a8.cpp"
#include "torch/quant_registration.cpp"

namespace {

using glowlm::bf16;
using glowlm::fp16;
using glowlm::vec::from_float;
using glowlm::vec::to_float;

struct Case {
  std::string name, op, xdt, wdt;
  double atol = 0, rtol = 0;
  std::map<std::string, int64_t> ints;
  std::map<std::string, double> floats;
  std::map<std::string, std::vector<float>> arrays;

  int64_t i(const std::string& k) const { return ints.at(k); }
  bool has(const std::string& k) const { return arrays.count(k) != 0; }
  const std::vector<float>& a(const std::string& k) const { return arrays.at(k); }
};

template <typename T>
std::vector<T> as(const std::vector<float>& v) {
  std::vector<T> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = from_float<T>(v[i]);
  return out;
}

template <typename T>
std::vector<float> floats(const std::vector<T>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = to_float(v[i]);
  return out;
}

std::vector<int64_t> int64s(const std::vector<float>& v) {
  return std::vector<int64_t>(v.begin(), v.end());
}
std::vector<int32_t> int32s(const std::vector<float>& v) {
  return std::vector<int32_t>(v.begin(), v.end());
}

// Empty if every element is within atol + rtol * |want| (NaN matches NaN), else why not.
std::string compare(const Case& c, const std::string& key, const std::vector<float>& got) {
  const std::vector<float>& want = c.a(key);
  if (got.size() != want.size())
    return key + ": " + std::to_string(got.size()) + " values, want " +
           std::to_string(want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = want[i];
    if (std::isnan(w) && std::isnan(g)) continue;
    if (!(std::fabs(g - w) <= c.atol + c.rtol * std::fabs(w))) {
      std::ostringstream os;
      os.precision(9);
      os << key << "[" << i << "] = " << g << ", want " << w;
      return os.str();
    }
  }
  return "";
}

template <typename T, typename WT>
std::string norm_case(const Case& c) {
  const int64_t rows = c.i("rows"), n = c.i("n");
  const float eps = static_cast<float>(c.floats.at("eps"));
  std::vector<T> x = as<T>(c.a("x")), out(rows * n), res_out(rows * n);
  std::vector<WT> w = as<WT>(c.a("w"));
  if (c.op == "rms_norm") {
    glowlm::cpu::rms_norm(x.data(), w.data(), out.data(), rows, n, eps);
    return compare(c, "want", floats(out));
  }
  if (c.op == "fused_add_rms_norm") {
    std::vector<T> r = as<T>(c.a("res"));
    glowlm::cpu::fused_add_rms_norm(x.data(), r.data(), w.data(), out.data(), res_out.data(),
                                    rows, n, eps);
    std::string e = compare(c, "want", floats(out));
    return e.empty() ? compare(c, "want_res", floats(res_out)) : e;
  }
  // layer_norm, optionally with a bias and a residual added first
  std::vector<WT> b = c.has("b") ? as<WT>(c.a("b")) : std::vector<WT>();
  std::vector<T> r = c.has("res") ? as<T>(c.a("res")) : std::vector<T>();
  glowlm::cpu::layer_norm(x.data(), r.empty() ? nullptr : r.data(), w.data(),
                          b.empty() ? nullptr : b.data(), out.data(),
                          r.empty() ? nullptr : res_out.data(), rows, n, eps);
  std::string e = compare(c, "want", floats(out));
  return e.empty() && !r.empty() ? compare(c, "want_res", floats(res_out)) : e;
}

template <typename T>
std::string act_case(const Case& c) {
  std::vector<T> x = as<T>(c.a("x"));
  if (c.op == "silu_and_mul") {
    const int64_t rows = c.i("rows"), d = c.i("d");
    std::vector<T> out(rows * d);
    glowlm::cpu::silu_and_mul(x.data(), out.data(), rows, d);
    return compare(c, "want", floats(out));
  }
  std::vector<T> out(x.size());
  const int64_t n = static_cast<int64_t>(x.size());
  if (c.op == "gelu") glowlm::cpu::gelu(x.data(), out.data(), n);
  else if (c.op == "gelu_tanh") glowlm::cpu::gelu_tanh(x.data(), out.data(), n);
  else glowlm::cpu::relu(x.data(), out.data(), n);
  return compare(c, "want", floats(out));
}

template <typename T>
std::string rotary_case(const Case& c) {
  const int64_t tokens = c.i("tokens"), heads = c.i("heads"), hs = c.i("head_size");
  std::vector<T> x = as<T>(c.a("x")), out(tokens * heads * hs);
  std::vector<int64_t> pos = int64s(c.a("positions"));
  const std::vector<float>& cache = c.a("cache");
  glowlm::cpu::rotary_embedding(pos.data(), x.data(), tokens, heads, hs, heads * hs, hs,
                                out.data(), cache.data(), c.i("rotary_dim"),
                                c.i("is_neox") != 0);
  return compare(c, "want", floats(out));
}

// x and y in T, weights in WT, bias (optional) in T.
template <typename T, typename WT>
std::string linear_case(const Case& c) {
  const int64_t M = c.i("m"), N = c.i("n"), K = c.i("k");
  std::vector<T> x = as<T>(c.a("x")), y(M * N);
  std::vector<WT> w = as<WT>(c.a("w"));
  if (c.op == "gemv") {
    // cpu::gemv as the torch op calls it: bf16 x bf16 takes the pairwise bf16 dot
    // product where the variant has it (the driver's first line says whether).
    std::vector<float> xf(M * K), yf(M * N);
    glowlm::cpu::gemv(x.data(), M, K, w.data(), yf.data(), N, xf.data());
    if (c.has("bias")) {
      std::vector<T> b = as<T>(c.a("bias"));
      glowlm::cpu::add_bias(yf.data(), b.data(), M, N);
    }
    glowlm::cpu::from_float_buf(yf.data(), y.data(), M * N);
  } else {
    std::vector<float> bias;
    if (c.has("bias")) bias = floats(as<T>(c.a("bias")));
    std::vector<float> xp(glowlm::cpu::packed_size(M, K));
    glowlm::cpu::gemm(x.data(), M, K, w.data(), bias.empty() ? nullptr : bias.data(),
                      y.data(), N, xp.data());
  }
  return compare(c, "want", floats(y));
}

// cpu::lora_shrink_expand: y + each row's slot update (slots -1: y as is), a/b in WT;
// gemv_max_m splits the cases between the GEMV and the blocked GEMM paths.
template <typename T, typename WT>
std::string lora_case(const Case& c) {
  const int64_t n = c.i("n"), in = c.i("in"), S = c.i("slots_n"), k = c.i("k");
  const int64_t out_f = c.i("out");
  std::vector<T> y = as<T>(c.a("y")), x = as<T>(c.a("x")), out(n * out_f);
  std::vector<WT> a = as<WT>(c.a("a")), b = as<WT>(c.a("b"));
  std::vector<int64_t> slots = int64s(c.a("slots"));
  glowlm::cpu::lora_shrink_expand(y.data(), x.data(), n, in, a.data(), b.data(), S, k, out_f,
                                  slots.data(), c.i("gemv_max_m"), out.data());
  return compare(c, "want", floats(out));
}

// write_kv of the step's keys/values into a cache in C, then paged attention; q/out in T.
template <typename T, typename C>
std::string attention_case(const Case& c) {
  const int64_t heads = c.i("heads"), kvh = c.i("kv_heads"), hs = c.i("head_size");
  const int64_t bs = c.i("block_size"), blocks = c.i("num_blocks"), tokens = c.i("tokens");
  const int64_t seqs = c.i("seqs"), max_blocks = c.i("max_blocks");
  std::vector<C> cache = as<C>(c.a("cache"));
  std::vector<C> k = as<C>(c.a("k")), v = as<C>(c.a("v"));
  std::vector<int64_t> slots = int64s(c.a("slots"));
  const int64_t kv_stride = blocks * kvh * bs * hs;
  glowlm::cpu::write_kv(cache.data(), kv_stride, bs, k.data(), kvh * hs, hs, v.data(),
                        kvh * hs, hs, slots.data(), tokens, kvh, hs);
  std::string e = compare(c, "want_cache", floats(cache));
  if (!e.empty()) return e;
  std::vector<float> q = floats(as<T>(c.a("q"))), out(q.size());
  std::vector<int32_t> tables = int32s(c.a("tables")), qsl = int32s(c.a("qsl"));
  std::vector<int32_t> lens = int32s(c.a("lens"));
  const glowlm::cpu::Geometry g{heads, kvh, heads / kvh, hs, bs, kvh * bs * hs, kv_stride,
                                max_blocks, static_cast<float>(c.floats.at("scale"))};
  glowlm::cpu::paged_attention(g, q.data(), out.data(), cache.data(), tables.data(),
                               qsl.data(), lens.data(), seqs);
  std::vector<T> rounded = as<T>(out);
  return compare(c, "want", floats(rounded));
}

at::ScalarType scalar_type(const std::string& dt) {
  return dt == "bf16" ? at::kBFloat16 : dt == "f16" ? at::kHalf : at::kFloat;
}

// A tensor of the case's values (exact in `t`: the host rounded them).
at::Tensor tensor(const std::vector<float>& v, std::vector<int64_t> shape, at::ScalarType t) {
  at::Tensor out(std::move(shape), t);
  if (out.numel() != static_cast<int64_t>(v.size()))
    throw std::runtime_error("case array of " + std::to_string(v.size()) + " values for " +
                             std::to_string(out.numel()) + " elements");
  for (int64_t i = 0; i < out.numel(); ++i) out.set(i, v[i]);
  return out;
}

// wna16_linear (weights in the prepared layout: uint8 bytes, scales and zero * scale
// [N/16, G, 16]) or w8a8_linear (int8 [N/16, K/4, 16, 4], scale, row sums),
// x / bias / y in the case's dtype.
std::string quant_case(const Case& c) {
  const at::ScalarType xt = scalar_type(c.xdt);
  const int64_t M = c.i("m"), K = c.i("k"), n = c.i("n"), blocks = c.i("blocks");
  const at::Tensor x = tensor(c.a("x"), {M, K}, xt);
  std::optional<at::Tensor> bias;
  if (c.has("bias")) bias = tensor(c.a("bias"), {n}, xt);
  at::Tensor y;
  if (c.op == "wna16_linear" || c.op == "wna8_linear") {
    const int64_t bits = c.i("bits"), group = c.i("group");
    const std::vector<int64_t> sg = {blocks, K / group, 16};
    // Scales and zero * scale in float32, or float16 (i scales_f16 1); no zs: symmetric.
    const at::ScalarType st = c.ints.count("scales_f16") && c.i("scales_f16") ? at::kHalf
                                                                               : at::kFloat;
    const at::Tensor zs = c.has("zs") ? tensor(c.a("zs"), sg, st) : at::empty({0}, {st});
    if (c.op == "wna16_linear") {
      y = glowlm::wna16_linear(x, tensor(c.a("weight"), {blocks * 16 * K * bits / 8},
                                         at::kByte),
                               tensor(c.a("scales"), sg, st), zs, bits, group, n, bias);
    } else {  // 8 bits: W8A8's signed layout
      const at::ScalarType wt = bits == 8 ? at::kChar : at::kByte;
      y = glowlm::wna8_linear(x, tensor(c.a("weight"), {blocks * 16 * K * bits / 8}, wt),
                              tensor(c.a("scales"), sg, st), zs, bits, group, n, bias);
    }
  } else {
    y = glowlm::w8a8_linear(x, tensor(c.a("weight"), {blocks, c.i("kq"), 16, 4}, at::kChar),
                            tensor(c.a("wscale"), {blocks * 16}, at::kFloat),
                            tensor(c.a("wsum"), {blocks * 16}, at::kInt),
                            c.floats.at("input_scale"), c.i("input_zp"), n, bias);
  }
  if (y.scalar_type() != xt || y.dim() != 2 || y.size(0) != M || y.size(1) != n)
    return "output is not [m, n] in x's dtype";
  std::vector<float> got(y.numel());
  for (int64_t i = 0; i < y.numel(); ++i) got[i] = y.get(i);
  return compare(c, "want", got);
}

// Calls F<T> for the dtype named `dt`.
#define GLOWLM_BY_DTYPE(dt, CALL)                          \
  do {                                                     \
    if ((dt) == "f32") { using T = float; return CALL; }   \
    if ((dt) == "bf16") { using T = bf16; return CALL; }   \
    if ((dt) == "f16") { using T = fp16; return CALL; }    \
  } while (0)

template <typename T>
std::string with_weight(const Case& c) {
  const bool norm = c.op == "rms_norm" || c.op == "fused_add_rms_norm" || c.op == "layer_norm";
  if (norm) {
    if (c.wdt == "f32") return norm_case<T, float>(c);
    return norm_case<T, T>(c);  // the norm weight has x's dtype or is fp32
  }
  if (c.op == "lora_shrink_expand") {
    if (c.wdt == "f32") return lora_case<T, float>(c);
    if (c.wdt == "bf16") return lora_case<T, bf16>(c);
    return lora_case<T, fp16>(c);
  }
  if (c.op == "gemv" || c.op == "gemm") {
    if (c.wdt == "f32") return linear_case<T, float>(c);
    if (c.wdt == "bf16") return linear_case<T, bf16>(c);
    return linear_case<T, fp16>(c);
  }
  if (c.wdt == "f32") return attention_case<T, float>(c);
  if (c.wdt == "bf16") return attention_case<T, bf16>(c);
  return attention_case<T, fp16>(c);
}

std::string run(const Case& c) {
  if (c.op == "wna16_linear" || c.op == "wna8_linear" || c.op == "w8a8_linear")
    return quant_case(c);
  if (c.op == "silu_and_mul" || c.op == "gelu" || c.op == "gelu_tanh" || c.op == "relu")
    GLOWLM_BY_DTYPE(c.xdt, act_case<T>(c));
  else if (c.op == "rotary_embedding")
    GLOWLM_BY_DTYPE(c.xdt, rotary_case<T>(c));
  else
    GLOWLM_BY_DTYPE(c.xdt, with_weight<T>(c));
  return "unknown op or dtype";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CASES\n", argv[0]);
    return 2;
  }
  std::ifstream in(argv[1]);
  if (!in) {
    std::fprintf(stderr, "cannot read %s\n", argv[1]);
    return 2;
  }
#if defined(GLOWLM_VEC_BF16DOT)
  constexpr int bf16dot = 1;
#else
  constexpr int bf16dot = 0;
#endif
  std::printf("isa %s W %d bf16dot %d\n", glowlm::vec::kIsa, glowlm::vec::W, bf16dot);
  int passed = 0, failed = 0;
  std::string tok;
  while (in >> tok) {
    if (tok != "case") {
      std::fprintf(stderr, "malformed case file at '%s'\n", tok.c_str());
      return 2;
    }
    Case c;
    in >> c.name >> c.op >> c.xdt >> c.wdt >> c.atol >> c.rtol;
    while (in >> tok && tok != "end") {
      std::string key;
      in >> key;
      if (tok == "i") {
        in >> c.ints[key];
      } else if (tok == "f") {
        in >> c.floats[key];
      } else {
        size_t n;
        in >> n;
        std::vector<float>& v = c.arrays[key];
        v.resize(n);
        for (size_t j = 0; j < n; ++j) {
          std::string s;
          in >> s;
          v[j] = std::strtof(s.c_str(), nullptr);  // also reads nan / inf
        }
      }
    }
    std::string err;
    try {
      err = run(c);
    } catch (const std::exception& e) {  // a kernel's argument check, or a malformed case
      err = std::string("error: ") + e.what();
    }
    if (err.empty()) {
      ++passed;
      std::printf("ok   %s\n", c.name.c_str());
    } else {
      ++failed;
      std::printf("FAIL %s: %s\n", c.name.c_str(), err.c_str());
    }
  }
  std::printf("summary %d %d\n", passed, failed);
  return failed ? 1 : 0;
}
