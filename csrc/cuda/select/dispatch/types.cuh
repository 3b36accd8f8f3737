// Host side: the C++ types of a call's ValueType and IndexType codes (with_types), and the
// index width rule (require_index_fits).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "gtopk/magnitude_order.h"
#include "gtopk/types.h"

namespace gtopk::cuda::detail {

inline void require_index_fits(IndexType index_type, int64_t d) {
    if (index_type == IndexType::kInt32 && !int32_indices_fit(d)) {
        throw std::invalid_argument("gtopk: int32 indices cannot address more than " +
                                    std::to_string(kInt32IndexLimit) + " entries");
    }
}

// Calls body(T{}, Index{}) with the C++ types that the codes name; `what` names the caller in
// errors. 16-bit value types are accepted only With16Bit.
template <bool With16Bit, typename Body>
auto with_types(ValueType value_type, IndexType index_type, const char* what, Body&& body) {
    auto with_index = [&](auto value_tag) {
        switch (index_type) {
            case IndexType::kInt32: return body(value_tag, int32_t{});
            case IndexType::kInt64: return body(value_tag, int64_t{});
        }
        throw std::invalid_argument(std::string("gtopk::cuda::") + what +
                                    ": unsupported index type");
    };
    switch (value_type) {
        case ValueType::kFloat32: return with_index(float{});
        case ValueType::kFloat64: return with_index(double{});
        case ValueType::kFloat16:
            if constexpr (With16Bit) return with_index(float16_bits{});
            break;
        case ValueType::kBFloat16:
            if constexpr (With16Bit) return with_index(bfloat16_bits{});
            break;
    }
    throw std::invalid_argument(std::string("gtopk::cuda::") + what +
                                (With16Bit ? ": unsupported value type"
                                           : ": only float32 and float64 values are supported"));
}

}  // namespace gtopk::cuda::detail
