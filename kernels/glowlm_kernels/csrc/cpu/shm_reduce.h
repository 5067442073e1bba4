// The shared-memory all-reduce of glowlm.distributed.shm, in C++, for fused stacks.
//
// Why: a tensor-parallel decoder stack sums two partial results per layer over the TP
// ranks (after the attention output and the MLP down projections). Returning to Python
// for each sum would undo what the stack is for (no interpreter between the kernels),
// so the stack calls this instead, on the very segment and op counter the Python
// ShmGroup uses: a rank may mix the two freely, since both follow one protocol.
//
// The protocol (glowlm/distributed/shm.py has the full story): the segment starts with
// int64 words (abort flag, then one stamp per rank), int32 futex words at byte 2048, and
// from byte 4096 two buffers of one slot per rank. Op `seq` uses buffer seq % 2; before
// writing its slot a rank waits until every rank published seq - 1; it writes, publishes
// seq (stamp, then wake word, then FUTEX_WAKE), waits for every stamp >= seq, and adds
// the slots in rank order (fp32 accumulation for 16-bit types), so all ranks get the
// same bits, the same bits as the Python path. Waits spin for `spin_ns`, then sleep in
// FUTEX_WAIT with a 100 ms timeout to look at the abort flag.
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "cpu/types.h"

namespace glowlm {
namespace shm {

constexpr size_t kControlBytes = 4096;
constexpr size_t kWordsOffset = 2048;

struct Group {
  char* base = nullptr;
  int64_t world = 1, rank = 0, slot_bytes = 0;
  int64_t* seq = nullptr;  // the op counter, shared with the Python ShmGroup
  int64_t spin_ns = 0;

  int64_t* control() const { return reinterpret_cast<int64_t*>(base); }
  int32_t* words() const { return reinterpret_cast<int32_t*>(base + kWordsOffset); }
  char* slot(int64_t buffer, int64_t r) const {
    return base + kControlBytes + (buffer * world + r) * slot_bytes;
  }
};

// A group from its state words: [segment address, world, rank, slot bytes, spin ns, op
// counter] (glowlm.distributed.shm.ShmGroup.native_state()); the counter is advanced in
// place. nullopt-like: .base == nullptr when the words do not describe a group.
inline Group from_state(int64_t* s) {
  Group g;
  if (s[0] == 0 || s[1] < 1 || s[2] < 0 || s[2] >= s[1] || s[3] <= 0) return g;
  g.base = reinterpret_cast<char*>(s[0]);
  g.world = s[1];
  g.rank = s[2];
  g.slot_bytes = s[3];
  g.spin_ns = s[4];
  g.seq = &s[5];
  return g;
}

inline int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// Waits until every rank's stamp is >= seq. Returns false when the group was aborted.
inline bool wait_all(const Group& g, int64_t seq) {
  int64_t* control = g.control();
  int64_t start = -1;
  for (int64_t r = 0; r < g.world; ++r) {
    if (r == g.rank) continue;
    int64_t spins = 0;
    while (__atomic_load_n(&control[r + 1], __ATOMIC_ACQUIRE) < seq) {
      if (__atomic_load_n(&control[0], __ATOMIC_RELAXED)) return false;
      if ((++spins & 63) != 0 && g.spin_ns > 0) continue;
      const int64_t now = now_ns();
      if (start < 0) start = now;
      if (now - start < g.spin_ns) continue;
      int32_t* word = &g.words()[r];
      const int32_t seen = __atomic_load_n(word, __ATOMIC_ACQUIRE);
      if (__atomic_load_n(&control[r + 1], __ATOMIC_ACQUIRE) >= seq) break;
      timespec timeout{0, 100000000};
      syscall(SYS_futex, word, FUTEX_WAIT, seen, &timeout, nullptr, 0);
    }
  }
  return true;
}

inline void publish(const Group& g, int64_t seq) {
  __atomic_store_n(&g.control()[g.rank + 1], seq, __ATOMIC_RELEASE);
  int32_t* word = &g.words()[g.rank];
  __atomic_store_n(word, static_cast<int32_t>(seq & 0x7fffffff), __ATOMIC_RELEASE);
  syscall(SYS_futex, word, FUTEX_WAKE, 0x7fffffff, nullptr, nullptr, 0);
}

// Sums x (n values of T) over the group in place. False: the group was aborted (x is
// then partly reduced and must not be used).
template <typename T>
bool all_reduce(const Group& g, T* x, int64_t n) {
  const int64_t per = g.slot_bytes / static_cast<int64_t>(sizeof(T));
  for (int64_t start = 0; start < n; start += per) {
    const int64_t len = n - start < per ? n - start : per;
    const int64_t seq = ++*g.seq;
    if (seq > 2 && !wait_all(g, seq - 1)) return false;
    const int64_t buffer = seq % 2;
    std::memcpy(g.slot(buffer, g.rank), x + start, len * sizeof(T));
    publish(g, seq);
    if (!wait_all(g, seq)) return false;
    T* out = x + start;
    const T* p0 = reinterpret_cast<const T*>(g.slot(buffer, 0));
    for (int64_t i = 0; i < len; ++i) {
      float acc = vec::to_float(p0[i]);
      for (int64_t r = 1; r < g.world; ++r)
        acc += vec::to_float(reinterpret_cast<const T*>(g.slot(buffer, r))[i]);
      out[i] = vec::from_float<T>(acc);
    }
  }
  return true;
}

}  // namespace shm
}  // namespace glowlm
