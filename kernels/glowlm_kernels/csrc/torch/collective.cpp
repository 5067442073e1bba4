// The compiled shared-memory all-reduce as an op of its own (cpu/shm_reduce.h).
//
// The fused decoder stacks call the algorithm directly; this op exposes it so tests
// can mix it with the Python ShmGroup's collectives on one segment (they must agree
// bit for bit and share the op counter) and benchmarks can time it.
#include "cpu/shm_reduce.h"
#include "torch/dispatch.h"
#include "torch/ops.h"

namespace glowlm {

void shm_all_reduce(at::Tensor& x, const at::Tensor& tp) {
  TORCH_CHECK(x.is_contiguous(), "shm_all_reduce: x must be contiguous");
  TORCH_CHECK(tp.scalar_type() == at::kLong && tp.numel() == 6 && tp.is_contiguous(),
              "shm_all_reduce: tp must be a contiguous int64 tensor of 6 values "
              "(ShmGroup.native_state())");
  const shm::Group g = shm::from_state(tp.data_ptr<int64_t>());
  TORCH_CHECK(g.base != nullptr, "shm_all_reduce: invalid group state");
  bool ok = true;
  GLOWLM_DISPATCH_FLOAT_TYPES(x.scalar_type(), "shm_all_reduce", [&] {
    ok = shm::all_reduce(g, ptr<scalar_t>(x), x.numel());
  });
  TORCH_CHECK(ok, "glowlm: the shared-memory group was stopped (another rank ended)");
}

}  // namespace glowlm
