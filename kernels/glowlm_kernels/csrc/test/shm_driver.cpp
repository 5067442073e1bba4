// Two ranks (fork) running the compiled shared-memory all-reduce (cpu/shm_reduce.h) on
// one MAP_SHARED segment laid out as glowlm.distributed.shm's: the check that the
// protocol, with its release stamps and acquire waits, compiles and runs on each CPU
// family (kernels/tests/test_cross_shm.py runs it natively and under qemu-user).
//
// Each rank sums, op after op, values that depend on the op, the rank and the element
// (fp32, bf16 and fp16, sizes that take several chunks of a small slot, so both buffers
// are reused), and checks every element of every result against the exact sum. A rank
// that read a stale or half-written slot gets a wrong sum. Prints "ok <ops>" and exits 0.
// Usage: shm_driver [ops]
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cpu/shm_reduce.h"

using namespace glowlm;

namespace {

constexpr int64_t kWorld = 2;
constexpr int64_t kSlot = 256;

// Small integers times 1/8: exact in bf16 and fp16 and in any summation order.
float value(int64_t op, int64_t rank, int64_t i) {
  return static_cast<float>((op * 7 + rank * 3 + i) % 61 - 30) * 0.125f;
}

template <typename T>
bool one_op(const shm::Group& g, int64_t op, int64_t n) {
  std::vector<T> x(n);
  for (int64_t i = 0; i < n; ++i) x[i] = vec::from_float<T>(value(op, g.rank, i));
  if (!shm::all_reduce(g, x.data(), n)) return false;
  for (int64_t i = 0; i < n; ++i) {
    float want = 0;
    for (int64_t r = 0; r < kWorld; ++r) want += value(op, r, i);
    if (vec::to_float(x[i]) != want) {
      std::fprintf(stderr, "rank %ld op %ld element %ld: %g, want %g\n",
                   static_cast<long>(g.rank), static_cast<long>(op), static_cast<long>(i),
                   vec::to_float(x[i]), want);
      return false;
    }
  }
  return true;
}

int run_rank(char* base, int64_t rank, int64_t ops) {
  int64_t state[6] = {reinterpret_cast<int64_t>(base), kWorld, rank, kSlot, 0, 0};
  const shm::Group g = shm::from_state(state);
  static const int64_t sizes[] = {1, 63, 64, 65, 200, 1000};
  for (int64_t op = 0; op < ops; ++op) {
    const int64_t n = sizes[op % 6];
    bool ok = op % 3 == 0 ? one_op<float>(g, op, n)
            : op % 3 == 1 ? one_op<bf16>(g, op, n) : one_op<fp16>(g, op, n);
    if (!ok) {
      __atomic_store_n(&g.control()[0], 1, __ATOMIC_RELAXED);  // stop the peer
      return 1;
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t ops = argc > 1 ? std::atol(argv[1]) : 600;
  const size_t bytes = shm::kControlBytes + 2 * kWorld * kSlot;
  void* mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {
    std::perror("mmap");
    return 2;
  }
  char* base = static_cast<char*>(mem);
  std::vector<pid_t> kids;
  for (int64_t r = 0; r < kWorld; ++r) {
    const pid_t pid = fork();
    if (pid == 0) _exit(run_rank(base, r, ops));
    kids.push_back(pid);
  }
  int failed = 0;
  for (pid_t pid : kids) {
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) failed = 1;
  }
  if (failed) return 1;
  std::printf("ok %ld\n", static_cast<long>(ops));
  return 0;
}
