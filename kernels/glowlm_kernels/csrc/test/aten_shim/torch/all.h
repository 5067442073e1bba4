// The few ATen names csrc/torch/quant_*.cpp use, for the torch-free contract driver.
//
// Why: the quantized linear kernels (weight-only 4/8-bit, W8A8) live in the torch binding
// files themselves, not in a torch-free csrc/cpu header, and torch does not run under
// qemu. The driver (contract_driver.cpp) compiles those very files against this header
// (only its build puts csrc/test/aten_shim first on the include path), so the code tested
// on aarch64 and s390x is the code the modules ship. Tensors here are dense, contiguous,
// host-owned buffers; `to` converts float / bf16 / fp16 with the kernels' own scalar
// conversions. Only what the kernels' fp32, bf16 and fp16 paths call is defined: a
// change in quant_*.cpp that needs more fails the driver's build, on purpose.
// (Once the algorithms move to a csrc/cpu header, as the other ops did, this goes.)
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu/types.h"

namespace c10 {

enum class ScalarType { Byte, Char, Int, Float, BFloat16, Half };
struct BFloat16 {
  uint16_t x;
};
struct Half {
  uint16_t x;
};

}  // namespace c10

namespace at {

using c10::BFloat16;
using c10::Half;
using c10::ScalarType;
constexpr ScalarType kByte = ScalarType::Byte;
constexpr ScalarType kChar = ScalarType::Char;
constexpr ScalarType kInt = ScalarType::Int;
constexpr ScalarType kFloat = ScalarType::Float;
constexpr ScalarType kBFloat16 = ScalarType::BFloat16;
constexpr ScalarType kHalf = ScalarType::Half;

inline size_t element_size(ScalarType t) {
  switch (t) {
    case kByte: case kChar: return 1;
    case kBFloat16: case kHalf: return 2;
    default: return 4;
  }
}

template <typename T> constexpr ScalarType type_of();
template <> constexpr ScalarType type_of<uint8_t>() { return kByte; }
template <> constexpr ScalarType type_of<int8_t>() { return kChar; }
template <> constexpr ScalarType type_of<int32_t>() { return kInt; }
template <> constexpr ScalarType type_of<float>() { return kFloat; }
template <> constexpr ScalarType type_of<BFloat16>() { return kBFloat16; }
template <> constexpr ScalarType type_of<Half>() { return kHalf; }

struct TensorOptions {
  ScalarType dt = kFloat;
  TensorOptions dtype(ScalarType t) const { return {t}; }
};

class Tensor {
 public:
  Tensor() = default;
  Tensor(std::vector<int64_t> shape, ScalarType dt) : shape_(std::move(shape)), dt_(dt) {
    buf_ = std::make_shared<std::vector<unsigned char>>(numel() * element_size(dt));
    data_ = buf_->data();
  }
  // A tensor over memory it does not own (bench_quant.cpp: weights in 2 MiB pages).
  static Tensor view(void* data, std::vector<int64_t> shape, ScalarType dt) {
    Tensor t;
    t.shape_ = std::move(shape);
    t.dt_ = dt;
    t.data_ = static_cast<unsigned char*>(data);
    return t;
  }

  bool defined() const { return buf_ != nullptr || data_ != nullptr; }
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  int64_t size(int64_t d) const { return shape_.at(d < 0 ? d + dim() : d); }
  const std::vector<int64_t>& sizes() const { return shape_; }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t s : shape_) n *= s;
    return n;
  }
  ScalarType scalar_type() const { return dt_; }
  bool is_contiguous() const { return true; }
  Tensor contiguous() const { return *this; }
  TensorOptions options() const { return {dt_}; }

  template <typename T>
  T* data_ptr() const {
    if (type_of<T>() != dt_) throw std::runtime_error("data_ptr: wrong dtype");
    return reinterpret_cast<T*>(data_);
  }
  void* data_ptr() const { return data_; }

  // A converted copy (float, bf16, fp16); the same tensor when the dtype already matches.
  Tensor to(ScalarType t) const {
    if (t == dt_) return *this;
    Tensor out(shape_, t);
    for (int64_t i = 0; i < numel(); ++i) out.set(i, get(i));
    return out;
  }

  // Unused by the kernels' float / bf16 / fp16 outputs (quant_common.h's finish falls
  // back to these only for other dtypes); refuse rather than pretend.
  Tensor narrow(int64_t, int64_t, int64_t) const {
    throw std::runtime_error("narrow is not in the contract driver's ATen subset");
  }
  Tensor operator+(const Tensor&) const {
    throw std::runtime_error("operator+ is not in the contract driver's ATen subset");
  }

  float get(int64_t i) const {
    const unsigned char* p = data_;
    switch (dt_) {
      case kFloat: return reinterpret_cast<const float*>(p)[i];
      case kBFloat16: return glowlm::vec::to_float(reinterpret_cast<const glowlm::bf16*>(p)[i]);
      case kHalf: return glowlm::vec::to_float(reinterpret_cast<const glowlm::fp16*>(p)[i]);
      case kByte: return p[i];
      case kChar: return static_cast<float>(reinterpret_cast<const int8_t*>(p)[i]);
      default: return static_cast<float>(reinterpret_cast<const int32_t*>(p)[i]);
    }
  }
  void set(int64_t i, float v) {
    unsigned char* p = data_;
    switch (dt_) {
      case kFloat: reinterpret_cast<float*>(p)[i] = v; break;
      case kBFloat16:
        reinterpret_cast<glowlm::bf16*>(p)[i] = glowlm::vec::from_float<glowlm::bf16>(v);
        break;
      case kHalf:
        reinterpret_cast<glowlm::fp16*>(p)[i] = glowlm::vec::from_float<glowlm::fp16>(v);
        break;
      case kByte: p[i] = static_cast<uint8_t>(v); break;
      case kChar: reinterpret_cast<int8_t*>(p)[i] = static_cast<int8_t>(v); break;
      default: reinterpret_cast<int32_t*>(p)[i] = static_cast<int32_t>(v); break;
    }
  }

 private:
  std::shared_ptr<std::vector<unsigned char>> buf_;  // owned storage (empty for a view)
  unsigned char* data_ = nullptr;
  std::vector<int64_t> shape_;
  ScalarType dt_ = kFloat;
};

inline Tensor empty(std::vector<int64_t> shape, TensorOptions o) {
  return Tensor(std::move(shape), o.dt);
}
inline Tensor zeros(std::vector<int64_t> shape, TensorOptions o) {
  return Tensor(std::move(shape), o.dt);  // the buffer starts zeroed
}

}  // namespace at

namespace glowlm_shim {

inline void append(std::ostringstream&) {}
template <typename A, typename... R>
void append(std::ostringstream& os, const A& a, const R&... r) {
  os << a;
  append(os, r...);
}
template <typename... A>
[[noreturn]] void fail(const char* cond, const A&... a) {
  std::ostringstream os;
  append(os, a...);
  const std::string msg = os.str();
  throw std::runtime_error(msg.empty() ? std::string("check failed: ") + cond : msg);
}

// Operator registration blocks compile to an unused function: the driver calls the C++
// entry points directly.
struct Library {
  void def(const char*) {}
  template <typename F>
  void impl(const char*, F) {}
};

}  // namespace glowlm_shim

#define TORCH_CHECK(cond, ...) \
  do {                         \
    if (!(cond)) glowlm_shim::fail(#cond, ##__VA_ARGS__); \
  } while (0)
#define TORCH_LIBRARY_FRAGMENT(ns, m) \
  [[maybe_unused]] static void glowlm_shim_fragment_##ns(glowlm_shim::Library& m)
#define TORCH_LIBRARY_IMPL(ns, k, m) \
  [[maybe_unused]] static void glowlm_shim_impl_##ns##_##k(glowlm_shim::Library& m)
