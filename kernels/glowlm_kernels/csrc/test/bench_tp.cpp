// A decode step's weight streaming at TP = 1 against TP = 2, in one process (torch-free).
//
// Why: issue 21's bar compares the engine's decode at TP = 2 (one thread per rank) with
// TP = 1 (two threads), and on a VM the engine's figures move 10-20 % between runs. This
// isolates the part that is the kernels' and the memory's: the decode GEMVs of one step
// of a Llama-shaped model (bf16 weights, one token row, 2 MiB pages), timed round-robin
//   tp1   every matrix once, all threads sharing it (cpu::gemv_f32's parallel_chunks),
//   tp2   each of two threads its own half-size shards (column-parallel q|k|v and
//         gate|up, row-parallel o and down, half the LM head), one thread per matrix,
//         with a barrier where the engine all-reduces (after o and after down),
// and prints the median milliseconds and weight GB/s of each and their ratio. A ratio
// near 1 says TP = 2's shards stream as fast as TP = 1's whole matrices, so what the
// engine loses beyond it is outside the GEMVs (the engine's own run: bench_tp.py).
//
// Built and run by tools/x86/bench_linear.py --native ISA --program tp; needs two
// OpenMP threads (OMP_NUM_THREADS=2, the default there on a 2-CPU host).
// Arguments: --reps R, --layers L, --hidden H, --inter I, --kv KV (the k and v width),
// --vocab V (defaults: the llama-1b shape).
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cpu/gemv.h"
#include "test/bench_util.h"

namespace {

using namespace glowlm;
using namespace glowlm::bench;

struct Mat {
  int64_t N, K;
  const bf16* w;
};

struct Shape {
  int64_t layers = 16, hidden = 2048, inter = 8192, kv = 512, vocab = 32000;
};

// A matrix's bytes as laid out (4 KiB-rounded, as the engine places tensors).
int64_t padded(int64_t N, int64_t K) { return (N * K * 2 + 4095) / 4096 * 4096; }

// One step's matrix shapes (per layer q|k|v, o, gate|up, down; then the head) of
// 1/parts of the model, as a rank holds them.
std::vector<std::pair<int64_t, int64_t>> step_shapes(const Shape& s, int parts) {
  const int64_t h = s.hidden;
  std::vector<std::pair<int64_t, int64_t>> shapes;
  for (int64_t l = 0; l < s.layers; ++l) {
    shapes.emplace_back((h + 2 * s.kv) / parts, h);
    shapes.emplace_back(h, h / parts);
    shapes.emplace_back(2 * s.inter / parts, h);
    shapes.emplace_back(h, s.inter / parts);
  }
  shapes.emplace_back(s.vocab / parts, h);
  return shapes;
}

int64_t bytes_of(const std::vector<std::pair<int64_t, int64_t>>& shapes) {
  int64_t b = 0;
  for (const auto& [N, K] : shapes) b += padded(N, K);
  return b;
}

// The matrices of `shapes` laid out from p on; p ends past the last.
std::vector<Mat> place(const std::vector<std::pair<int64_t, int64_t>>& shapes, char*& p) {
  std::vector<Mat> mats;
  for (const auto& [N, K] : shapes) {
    mats.push_back({N, K, reinterpret_cast<const bf16*>(p)});
    p += padded(N, K);
  }
  return mats;
}

}  // namespace

int main(int argc, char** argv) {
  Shape s;
  int reps = 9;
  if (argc % 2 == 0) {
    std::fprintf(stderr, "usage: %s [--reps R] [--layers L] [--hidden H] [--inter I] "
                 "[--kv KV] [--vocab V]\n", argv[0]);
    return 2;
  }
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const int64_t v = std::atoll(argv[i + 1]);
    if (a == "--reps") reps = static_cast<int>(v);
    else if (a == "--layers") s.layers = v;
    else if (a == "--hidden") s.hidden = v;
    else if (a == "--inter") s.inter = v;
    else if (a == "--kv") s.kv = v;
    else if (a == "--vocab") s.vocab = v;
    else {
      std::fprintf(stderr, "usage: %s [--reps R] [--layers L] [--hidden H] [--inter I] "
                   "[--kv KV] [--vocab V]\n", argv[0]);
      return 2;
    }
  }
  if (num_threads() < 2) {
    std::fprintf(stderr, "bench_tp needs 2 threads (OMP_NUM_THREADS=2)\n");
    return 2;
  }
  const auto shapes1 = step_shapes(s, 1), shapes2 = step_shapes(s, 2);
  const int64_t b1 = bytes_of(shapes1), b2 = bytes_of(shapes2);
  HugeBuffer buf(static_cast<size_t>(b1 + 2 * b2));
  for (int64_t i = 0; i < b1 + 2 * b2; i += 4096) buf.data[i] = 0;  // fault every page in
  char* p = buf.data;
  const std::vector<Mat> whole = place(shapes1, p);
  const std::vector<Mat> shard[2] = {place(shapes2, p), place(shapes2, p)};
  const int64_t widest = std::max(2 * s.inter, s.vocab);
  std::vector<float> x(static_cast<size_t>(std::max(s.hidden, s.inter)), 0.01f);
  std::vector<float> y(static_cast<size_t>(widest)), y2[2] = {y, y};
  std::printf("isa %s W %d threads %d; %lld layers, hidden %lld, intermediate %lld, kv %lld, "
              "vocab %lld; weights per step %.0f MiB (TP = 1), %.0f MiB per rank (TP = 2), "
              "%.0f %% in huge pages\n", kIsa, vec::W, num_threads(),
              static_cast<long long>(s.layers), static_cast<long long>(s.hidden),
              static_cast<long long>(s.inter), static_cast<long long>(s.kv),
              static_cast<long long>(s.vocab), b1 / 1048576.0, b2 / 1048576.0,
              100.0 * anon_huge_kib() * 1024.0 / static_cast<double>(b1 + 2 * b2));
  std::vector<double> t1, t2;
  for (int r = -1; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    for (const Mat& m : whole) cpu::gemv_f32(x.data(), 1, m.K, m.w, y.data(), m.N);
    if (r >= 0) t1.push_back(seconds_since(t0));
    t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(2)
    {
      const int rank = omp_get_thread_num();
      const std::vector<Mat>& mine = shard[rank];
      for (size_t i = 0; i < mine.size(); ++i) {
        cpu::gemv_f32(x.data(), 1, mine[i].K, mine[i].w, y2[rank].data(), mine[i].N);
        if (i % 4 == 1 || i % 4 == 3) {  // after o and after down: the all-reduces
#pragma omp barrier
        }
      }
    }
    if (r >= 0) t2.push_back(seconds_since(t0));
  }
  const double a = median(t1), b = median(t2);
  const auto [a_lo, a_hi] = std::minmax_element(t1.begin(), t1.end());
  const auto [b_lo, b_hi] = std::minmax_element(t2.begin(), t2.end());
  std::printf("tp1 (2 threads share each matrix)   %7.2f ms (%.2f-%.2f)  %5.1f GB/s\n",
              a * 1e3, *a_lo * 1e3, *a_hi * 1e3, b1 / a / 1e9);
  std::printf("tp2 (1 thread per rank, own shards) %7.2f ms (%.2f-%.2f)  %5.1f GB/s\n",
              b * 1e3, *b_lo * 1e3, *b_hi * 1e3, 2.0 * b2 / b / 1e9);
  std::printf("tp2 / tp1 speed: %.3f (median of %d steps each, round-robin)\n", a / b, reps);
  return 0;
}
