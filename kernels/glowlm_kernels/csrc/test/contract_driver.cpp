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
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "cpu/attention.h"
#include "cpu/gemm.h"
#include "cpu/gemv.h"
#include "cpu/norm_act.h"
#include "cpu/rotary.h"

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
    std::vector<float> xf(M * K), yf(M * N);
    glowlm::cpu::to_float_buf(x.data(), xf.data(), M * K);
    glowlm::cpu::gemv_f32(xf.data(), M, K, w.data(), yf.data(), N);
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
  std::printf("isa %s W %d\n", glowlm::vec::kIsa, glowlm::vec::W);
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
    const std::string err = run(c);
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
