// The timing and read-bandwidth helpers of the decode benches (bench_gemv.cpp: dense
// GEMV; bench_quant.cpp: the quantized kernels), torch-free.
//
// Each bench allocates enough copies of one matrix (in its storage format) to exceed the
// last-level cache many times, in 2 MiB pages as the engine keeps weights, and times
// round-robin in one process a plain read of those bytes and its kernels on them
// (run_round_robin): on a VM the read bandwidth moves by 20-40 % between minutes
// (docs/performance.md), so a kernel's figure of merit is its share of the read measured
// in the same run.
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "cpu/parallel.h"
#include "cpu/vec.h"

namespace glowlm::bench {

using namespace glowlm::vec;

constexpr int64_t kHugePage = 2 << 20;
constexpr int kReadAcc = 8;  // independent sums: the read is never latency bound
constexpr int64_t kReadChunkBytes = 256 << 10;  // a GEMV chunk of 64 rows of 4 KiB

inline volatile float g_sink;  // keeps the read's sums alive

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
inline int64_t anon_huge_kib() {
  std::ifstream f("/proc/self/smaps_rollup");
  std::string key;
  int64_t value;
  while (f >> key) {
    if (key == "AnonHugePages:" && f >> value) return value;
  }
  return -1;
}

// Sum of `bytes` bytes with all threads: chunks of kReadChunkBytes, each one stream.
inline void read_matrix(const char* p, int64_t bytes) {
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

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct Config {
  std::string name;
  std::function<void(const char* w)> run;  // one call on one copy of the matrix
  std::vector<double> gbs;
};

// `copies` copies of a matrix of `bytes` bytes, `stride` apart (4 KiB-rounded, as the
// engine places tensors), in one HugeBuffer; fill(p) writes one copy's bytes at p and
// the rest are copied from it (the values do not matter, the bytes read do).
struct Copies {
  int64_t bytes, stride, copies;
  HugeBuffer buf;
  int64_t huge_kib;

  Copies(int64_t bytes_, int64_t min_bytes, const std::function<void(char*)>& fill)
      : bytes(bytes_),
        stride((bytes_ + 4095) / 4096 * 4096),
        copies(std::max<int64_t>(2, (min_bytes + bytes_ - 1) / bytes_)),
        buf(static_cast<size_t>(copies * stride)) {
    fill(buf.data);
    for (int64_t c = 1; c < copies; ++c) std::memcpy(buf.data + c * stride, buf.data, bytes);
    huge_kib = anon_huge_kib();
  }
  const char* at(int64_t c) const { return buf.data + c * stride; }
};

// A "read" config first, then `configs`, timed round-robin over all copies per
// repetition (after one warm-up pass: page faults, thread start); prints per config the
// median GB/s of `bytes` per call, its range, its share of the read's median, us/call.
inline void run_round_robin(const char* label, int64_t N, int64_t K, const Copies& m,
                            std::vector<Config> configs, int reps) {
  configs.insert(configs.begin(),
                 Config{"read", [&](const char* w) { read_matrix(w, m.bytes); }, {}});
  for (int r = -1; r < reps; ++r) {
    for (Config& c : configs) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int64_t i = 0; i < m.copies; ++i) c.run(m.at(i));
      const double s = seconds_since(t0);
      if (r >= 0) c.gbs.push_back(static_cast<double>(m.copies * m.bytes) / s / 1e9);
    }
  }
  std::printf("%-7s %6lldx%-5lld %lld copies of %.1f MiB, %.0f %% in huge pages\n", label,
              static_cast<long long>(N), static_cast<long long>(K),
              static_cast<long long>(m.copies), m.bytes / 1048576.0,
              100.0 * m.huge_kib * 1024.0 / static_cast<double>(m.copies * m.stride));
  const double read = median(configs[0].gbs);
  for (const Config& c : configs) {
    const double g = median(c.gbs);
    const auto [lo, hi] = std::minmax_element(c.gbs.begin(), c.gbs.end());
    std::printf("%-7s %6lldx%-5lld %-13s %6.1f GB/s  (%5.1f-%5.1f)  %5.1f %% of read  "
                "%8.1f us/call\n", label, static_cast<long long>(N), static_cast<long long>(K),
                c.name.c_str(), g, *lo, *hi, 100.0 * g / read, m.bytes / g / 1e3);
  }
  std::fflush(stdout);
}

// "NxK,NxK,..." -> shapes.
inline std::vector<std::pair<int64_t, int64_t>> parse_shapes(const std::string& s) {
  std::vector<std::pair<int64_t, int64_t>> shapes;
  for (size_t p = 0; p < s.size();) {
    const size_t e = std::min(s.find(',', p), s.size());
    const std::string t = s.substr(p, e - p);
    const size_t xpos = t.find('x');
    shapes.emplace_back(std::stoll(t.substr(0, xpos)), std::stoll(t.substr(xpos + 1)));
    p = e + 1;
  }
  return shapes;
}

// The command line every bench takes: --reps R, --min-mib MiB (copies of each matrix,
// so every timed call reads DRAM, not cache), --shapes NxK,... and one comma list of
// its own (`list_flag`: bench_gemv's --dtypes, bench_quant's --formats). Bad flags are
// a usage line and exit 2. Prints the header line the Python side parses.
struct BenchArgs {
  int reps = 7;
  int64_t min_mib = 512;
  std::vector<std::pair<int64_t, int64_t>> shapes;
  std::string list;

  // Whether `item` is a whole entry of the list.
  bool has(const std::string& item) const {
    return ("," + list + ",").find("," + item + ",") != std::string::npos;
  }
};

inline BenchArgs parse_bench_args(int argc, char** argv, const std::string& list_flag,
                                  std::string list,
                                  std::vector<std::pair<int64_t, int64_t>> shapes) {
  BenchArgs b;
  b.list = std::move(list);
  b.shapes = std::move(shapes);
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
      b.reps = std::stoi(next());
    } else if (a == "--min-mib") {
      b.min_mib = std::stoll(next());
    } else if (a == list_flag) {
      b.list = next();
    } else if (a == "--shapes") {  // NxK,NxK,...
      b.shapes = parse_shapes(next());
    } else {
      std::fprintf(stderr, "usage: %s [--reps R] [--min-mib MiB] [%s %s] [--shapes NxK,...]\n",
                   argv[0], list_flag.c_str(), b.list.c_str());
      std::exit(2);
    }
  }
#if defined(GLOWLM_VEC_BF16DOT)
  constexpr int bf16dot = 1;
#else
  constexpr int bf16dot = 0;
#endif
  std::printf("isa %s W %d bf16dot %d threads %d reps %d copies >= %lld MiB per shape\n",
              kIsa, W, bf16dot, num_threads(), b.reps, static_cast<long long>(b.min_mib));
  return b;
}

}  // namespace glowlm::bench
