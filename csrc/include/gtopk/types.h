// What the kernels and the Python layer must agree on: the index width rule and the type codes
// of the CUDA entry points. bindings.cpp exports them (_C.INT32_INDEX_LIMIT,
// _C.int32_indices_fit, _C.ValueType, _C.IndexType); gtopk_hvd/ops/ uses only those.
#pragma once

#include <cstdint>
#include <limits>

namespace gtopk {

// The indices of a dense vector of d values are 0 .. d - 1, so int32 holds them all iff
// d <= kInt32IndexLimit (2^31); longer vectors need int64 indices.
constexpr int64_t kInt32IndexLimit = int64_t{std::numeric_limits<int32_t>::max()} + 1;

constexpr bool int32_indices_fit(int64_t d) { return d <= kInt32IndexLimit; }

enum class ValueType : int { kFloat32 = 0, kFloat64 = 1, kFloat16 = 2, kBFloat16 = 3 };
enum class IndexType : int { kInt32 = 0, kInt64 = 1 };

}  // namespace gtopk
