// The quantized linear ops' schemas and CPU implementations (quant_wna16.cpp,
// quant_wna8.cpp, quant_w8a8.cpp), registered in this one place.
//
// A fragment of the plugin's library (registration.cpp declares the other ops): every
// module built from the tree links these sources, and glowlm-x86's load_quant_ops can
// still compile the quantized sources alone into a module loaded beside one built
// without them.
#include <torch/all.h>

#include "torch/quant_ops.h"

// The plugin's torch.ops namespace (-DGLOWLM_OPS_NAMESPACE in the shared tree's builds).
#ifndef GLOWLM_OPS_NAMESPACE
#define GLOWLM_OPS_NAMESPACE glowlm_x86
#endif
#define GLOWLM_QUANT_FRAGMENT(ns, m) TORCH_LIBRARY_FRAGMENT(ns, m)
#define GLOWLM_QUANT_IMPL(ns, k, m) TORCH_LIBRARY_IMPL(ns, k, m)

GLOWLM_QUANT_FRAGMENT(GLOWLM_OPS_NAMESPACE, m) {
  m.def("wna16_linear(Tensor x, Tensor weight, Tensor scales, Tensor zs, int bits,"
        " int group_size, int n, Tensor? bias) -> Tensor");
  m.def("w8a8_linear(Tensor x, Tensor weight, Tensor wscale, Tensor wsum, float input_scale,"
        " int input_zp, int n, Tensor? bias) -> Tensor");
  m.def("wna8_linear(Tensor x, Tensor weight, Tensor scales, Tensor zs, int bits,"
        " int group_size, int n, Tensor? bias) -> Tensor");
  m.def("quantize_rows(Tensor x, float input_scale, int input_zp) -> (Tensor, Tensor)");
}

GLOWLM_QUANT_IMPL(GLOWLM_OPS_NAMESPACE, CPU, m) {
  m.impl("wna16_linear", &glowlm::wna16_linear);
  m.impl("w8a8_linear", &glowlm::w8a8_linear);
  m.impl("wna8_linear", &glowlm::wna8_linear);
  m.impl("quantize_rows", &glowlm::quantize_rows);
}
