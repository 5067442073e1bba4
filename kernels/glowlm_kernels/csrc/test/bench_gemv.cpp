// Decode GEMV against the read bandwidth of the same matrices, in one process (torch-free).
//
// Why: the decode GEMV is bound by memory bandwidth, so its figure of merit is the share
// of a plain read it reaches, and on a VM the read bandwidth moves by 20-40 % between
// minutes (docs/performance.md). So this measures both on the same matrices, round-robin
// in one process: for each llama-1b decode shape (N x K) and weight dtype it allocates
// enough copies of the matrix to exceed the last-level cache many times (every call
// reads its weights from DRAM, as a decode step does), in 2 MiB pages as the engine
// keeps weights (one mapping advised MADV_HUGEPAGE, core/glowlm/runtime/hugepages.py),
// and per repetition times one pass over all copies of
//   read      a plain read: each thread takes chunks (parallel_chunks, as the GEMV)
//             and sums them with the vector header's loads (AVX-512: 64-byte loads)
//             into kReadAcc independent accumulators, one sequential stream per chunk;
//   f32       cpu::gemv_f32: x converted to fp32 once, weights converted in registers
//             (the old bf16 path; the only fp32 path);
//   bf16dot   cpu::gemv_bf16: bf16 x and weights straight into dot2 (vectors headers
//             with GLOWLM_VEC_BF16DOT: AVX512_BF16, Arm BF16),
// for M = 1 and 4 token rows. GB/s counts weight bytes (x and y are a few KiB); each
// figure is the median over the repetitions, and "of read" is the GEMV's median over the
// read's median of the same shape.
//
// Built and run by plugins/x86/tools/bench_linear.py --native ISA (the variant's flags
// from glowlm_kernels.build); OMP_NUM_THREADS sets the threads (default: all cores).
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "cpu/gemv.h"

namespace {

using namespace glowlm;
using namespace glowlm::vec;

constexpr int64_t kHugePage = 2 << 20;
constexpr int kReadAcc = 8;  // independent sums: the read is never latency bound
constexpr int64_t kReadChunkBytes = 256 << 10;  // a GEMV chunk of 64 rows of 4 KiB

volatile float g_sink;  // keeps the read's sums alive

// A 2 MiB-aligned anonymous mapping advised MADV_HUGEPAGE (THP "madvise" or "always").
struct HugeBuffer {
  void* base = nullptr;
  size_t mapped = 0;
  char* data = nullptr;

  explicit HugeBuffer(size_t bytes) {
    mapped = bytes + kHugePage;
    base = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) {
      std::perror("mmap");
      std::exit(1);
    }
    madvise(base, mapped, MADV_HUGEPAGE);
    const uintptr_t p = reinterpret_cast<uintptr_t>(base);
    data = reinterpret_cast<char*>((p + kHugePage - 1) / kHugePage * kHugePage);
  }
  ~HugeBuffer() { munmap(base, mapped); }
  HugeBuffer(const HugeBuffer&) = delete;
  HugeBuffer& operator=(const HugeBuffer&) = delete;
};

// AnonHugePages of this process in KiB (/proc/self/smaps_rollup), -1 if unreadable.
int64_t anon_huge_kib() {
  std::ifstream f("/proc/self/smaps_rollup");
  std::string key;
  int64_t value;
  while (f >> key) {
    if (key == "AnonHugePages:" && f >> value) return value;
  }
  return -1;
}

// Sum of a whole matrix with all threads: chunks of kReadChunkBytes, each one stream.
void read_matrix(const char* p, int64_t bytes) {
  const int64_t chunks = (bytes + kReadChunkBytes - 1) / kReadChunkBytes;
  static std::vector<float> sums;  // one caller at a time; the workers write their chunks
  sums.assign(static_cast<size_t>(chunks), 0.0f);
  parallel_chunks(chunks, [&](int64_t c) {
    const float* f = reinterpret_cast<const float*>(p + c * kReadChunkBytes);
    const int64_t n = std::min(kReadChunkBytes, bytes - c * kReadChunkBytes) /
                      static_cast<int64_t>(sizeof(float));
    VecF acc[kReadAcc];
    GLOWLM_UNROLL for (int a = 0; a < kReadAcc; ++a) acc[a] = zero();
    for (int64_t i = 0; i + kReadAcc * W <= n; i += kReadAcc * W) {
      GLOWLM_UNROLL for (int a = 0; a < kReadAcc; ++a) acc[a] = add(acc[a], load(f + i + a * W));
    }
    for (int a = 1; a < kReadAcc; ++a) acc[0] = add(acc[0], acc[a]);
    sums[c] = reduce_add(acc[0]);
  });
  g_sink = sums[0];
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct Config {
  std::string name;
  std::function<void(const char* w)> run;  // one call on one copy of the matrix
  std::vector<double> gbs;
};

template <typename WT>
void bench_shape(int64_t N, int64_t K, const char* dtype, int reps, int64_t min_bytes) {
  const int64_t bytes = N * K * static_cast<int64_t>(sizeof(WT));
  const int64_t stride = (bytes + 4095) / 4096 * 4096;  // tensors 4 KiB apart, as the engine
  const int64_t copies = std::max<int64_t>(2, (min_bytes + bytes - 1) / bytes);
  HugeBuffer buf(static_cast<size_t>(copies * stride));
  std::mt19937 gen(0);
  std::normal_distribution<float> normal(0.0f, 1.0f / std::sqrt(static_cast<float>(K)));
  {  // one random matrix, copied: the values do not matter, the bytes read do
    std::vector<WT> w(static_cast<size_t>(N * K));
    for (auto& v : w) v = from_float<WT>(normal(gen));
    for (int64_t c = 0; c < copies; ++c) std::memcpy(buf.data + c * stride, w.data(), bytes);
  }
  const int64_t huge_kib = anon_huge_kib();
  constexpr int64_t kMaxM = 4;
  std::vector<float> xf(kMaxM * K), xbuf(kMaxM * K), y(kMaxM * N);
  std::vector<WT> x(kMaxM * K);
  std::vector<bf16> xb(kMaxM * K);
  std::normal_distribution<float> unit(0.0f, 1.0f);
  for (int64_t i = 0; i < kMaxM * K; ++i) {
    x[i] = from_float<WT>(unit(gen));
    xb[i] = from_float<bf16>(to_float(x[i]));
  }
  std::vector<Config> configs;
  configs.push_back({"read", [&](const char* w) { read_matrix(w, bytes); }, {}});
  for (int64_t M : {1, 4}) {
    const std::string m = " M=" + std::to_string(M);
    configs.push_back({"f32" + m, [&, M](const char* w) {
      cpu::to_float_buf(x.data(), xbuf.data(), M * K);  // the op converts x once per call
      cpu::gemv_f32(xbuf.data(), M, K, reinterpret_cast<const WT*>(w), y.data(), N);
    }, {}});
#if defined(GLOWLM_VEC_BF16DOT)
    if constexpr (std::is_same_v<WT, bf16>) {
      configs.push_back({"bf16dot" + m, [&, M](const char* w) {
        cpu::gemv_bf16(xb.data(), M, K, reinterpret_cast<const bf16*>(w), y.data(), N);
      }, {}});
    }
#endif
  }
  for (int r = -1; r < reps; ++r) {  // r = -1: warm-up (page faults, thread start)
    for (Config& c : configs) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int64_t i = 0; i < copies; ++i) c.run(buf.data + i * stride);
      const double s = seconds_since(t0);
      if (r >= 0) c.gbs.push_back(static_cast<double>(copies * bytes) / s / 1e9);
    }
  }
  std::printf("%-5s %6lldx%-5lld %lld copies of %.1f MiB, %.0f %% in huge pages\n", dtype,
              static_cast<long long>(N), static_cast<long long>(K),
              static_cast<long long>(copies), bytes / 1048576.0,
              100.0 * huge_kib * 1024.0 / static_cast<double>(copies * stride));
  const double read = median(configs[0].gbs);
  for (const Config& c : configs) {
    const double g = median(c.gbs);
    const auto [lo, hi] = std::minmax_element(c.gbs.begin(), c.gbs.end());
    std::printf("%-5s %6lldx%-5lld %-11s %6.1f GB/s  (%5.1f-%5.1f)  %5.1f %% of read  "
                "%8.1f us/call\n", dtype, static_cast<long long>(N), static_cast<long long>(K),
                c.name.c_str(), g, *lo, *hi, 100.0 * g / read, bytes / g / 1e3);
  }
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 7;
  int64_t min_mib = 512;
  std::vector<std::pair<int64_t, int64_t>> shapes = {
      {2048, 2048}, {512, 2048}, {16384, 2048}, {2048, 8192}, {32000, 2048}};
  std::string dtypes = "bf16,f32";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--reps") {
      reps = std::stoi(next());
    } else if (a == "--min-mib") {
      min_mib = std::stoll(next());
    } else if (a == "--dtypes") {
      dtypes = next();
    } else if (a == "--shapes") {  // NxK,NxK,...
      shapes.clear();
      std::string s = next();
      for (size_t p = 0; p < s.size();) {
        const size_t e = std::min(s.find(',', p), s.size());
        const std::string t = s.substr(p, e - p);
        const size_t xpos = t.find('x');
        shapes.emplace_back(std::stoll(t.substr(0, xpos)), std::stoll(t.substr(xpos + 1)));
        p = e + 1;
      }
    } else {
      std::fprintf(stderr,
                   "usage: %s [--reps R] [--min-mib MiB] [--dtypes bf16,f32] "
                   "[--shapes NxK,...]\n", argv[0]);
      return 2;
    }
  }
#if defined(GLOWLM_VEC_BF16DOT)
  constexpr int bf16dot = 1;
#else
  constexpr int bf16dot = 0;
#endif
  std::printf("isa %s W %d bf16dot %d threads %d reps %d copies >= %lld MiB per shape\n",
              kIsa, W, bf16dot, num_threads(), reps, static_cast<long long>(min_mib));
  for (const auto& [N, K] : shapes) {
    if (dtypes.find("bf16") != std::string::npos)
      bench_shape<bf16>(N, K, "bf16", reps, min_mib << 20);
    if (dtypes.find("f32") != std::string::npos)
      bench_shape<float>(N, K, "f32", reps, min_mib << 20);
  }
  return 0;
}
