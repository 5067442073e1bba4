// glowlm-example's one compiled op: RMSNorm over the last dimension.
//
// The contract is glowlm.ops.reference.rms_norm: the sum of squares and the scaling
// in float32 whatever the input dtype; with a weight of the input's dtype the
// normalised row is rounded to that dtype before it is multiplied by the weight
// (as an unfused model in that dtype does), with a float32 weight it is multiplied
// in float32 and rounded once. Rows run in parallel; within a row the loop is plain
// C++ that the compiler vectorises. Built at install (setup.py) into glowlm_example._C;
// importing that module runs TORCH_LIBRARY's registration.
#include <Python.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include <cmath>

namespace {

template <typename scalar_t, typename weight_t>
void rms_norm_rows(const scalar_t* x, const weight_t* w, scalar_t* out, int64_t rows,
                   int64_t width, double eps) {
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const scalar_t* xr = x + r * width;
      scalar_t* outr = out + r * width;
      float sum = 0.f;
      for (int64_t i = 0; i < width; ++i) {
        const float v = static_cast<float>(xr[i]);
        sum += v * v;
      }
      const float inv = 1.f / std::sqrt(sum / static_cast<float>(width) + static_cast<float>(eps));
      for (int64_t i = 0; i < width; ++i) {
        const float normed = static_cast<float>(xr[i]) * inv;
        if constexpr (std::is_same_v<scalar_t, weight_t>) {
          // Round the normalised value first, as reference's `xf.to(x.dtype) * weight`.
          const float rounded = static_cast<float>(static_cast<scalar_t>(normed));
          outr[i] = static_cast<scalar_t>(rounded * static_cast<float>(w[i]));
        } else {
          outr[i] = static_cast<scalar_t>(normed * static_cast<float>(w[i]));
        }
      }
    }
  });
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.dim() >= 1, "rms_norm: x must have at least one dimension");
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(-1),
              "rms_norm: weight must be [", x.size(-1), "], got ", weight.sizes());
  TORCH_CHECK(weight.scalar_type() == x.scalar_type() ||
                  weight.scalar_type() == at::kFloat,
              "rms_norm: weight must be x's dtype or float32, got ", weight.scalar_type());
  const at::Tensor xc = x.contiguous();
  const at::Tensor wc = weight.contiguous();
  at::Tensor out = at::empty_like(xc);
  const int64_t width = x.size(-1);
  const int64_t rows = width ? xc.numel() / width : 0;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "rms_norm", [&] {
    if (wc.scalar_type() == x.scalar_type()) {
      rms_norm_rows<scalar_t, scalar_t>(xc.data_ptr<scalar_t>(), wc.data_ptr<scalar_t>(),
                                        out.data_ptr<scalar_t>(), rows, width, eps);
    } else {
      rms_norm_rows<scalar_t, float>(xc.data_ptr<scalar_t>(), wc.data_ptr<float>(),
                                     out.data_ptr<scalar_t>(), rows, width, eps);
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY(glowlm_example, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
}

TORCH_LIBRARY_IMPL(glowlm_example, CPU, m) {
  m.impl("rms_norm", &rms_norm);
}

// An empty Python module, so `import glowlm_example._C` loads this library and runs
// the registrations above (the pattern of PyTorch's custom-op tutorial).
extern "C" PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module_def);
}
