// The C++ types that the ValueType and IndexType codes (types.h) name, for the entries of both
// devices: body(T{}) or body(T{}, Index{}) is called with them. `scope` and `what` name the
// caller in errors ("gtopk::cuda::", "topk_abs"). With16Bit: float16 and bfloat16 values (their
// bit patterns, magnitude_order.h) are accepted too; otherwise float32 and float64 only (the
// 16-bit bodies are not even instantiated). Unknown codes are std::invalid_argument.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "gtopk/magnitude_order.h"
#include "gtopk/types.h"

namespace gtopk {

// int32 indices cannot address more than kInt32IndexLimit entries (types.h).
inline void require_index_fits(IndexType index_type, int64_t d) {
    if (index_type == IndexType::kInt32 && !int32_indices_fit(d)) {
        throw std::invalid_argument("gtopk: int32 indices cannot address more than " +
                                    std::to_string(kInt32IndexLimit) + " entries");
    }
}

template <bool With16Bit, typename Body>
auto with_value_type(ValueType value_type, const char* scope, const char* what, Body&& body) {
    switch (value_type) {
        case ValueType::kFloat32: return body(float{});
        case ValueType::kFloat64: return body(double{});
        case ValueType::kFloat16:
            if constexpr (With16Bit) return body(float16_bits{});
            break;
        case ValueType::kBFloat16:
            if constexpr (With16Bit) return body(bfloat16_bits{});
            break;
    }
    throw std::invalid_argument(std::string(scope) + what +
                                (With16Bit ? ": unsupported value type"
                                           : ": only float32 and float64 values are supported"));
}

template <typename Body>
auto with_index_type(IndexType index_type, const char* scope, const char* what, Body&& body) {
    switch (index_type) {
        case IndexType::kInt32: return body(int32_t{});
        case IndexType::kInt64: return body(int64_t{});
    }
    throw std::invalid_argument(std::string(scope) + what + ": unsupported index type");
}

template <bool With16Bit, typename Body>
auto with_types(ValueType value_type, IndexType index_type, const char* scope, const char* what,
                Body&& body) {
    return with_value_type<With16Bit>(value_type, scope, what, [&](auto value_tag) {
        return with_index_type(index_type, scope, what,
                               [&](auto index_tag) { return body(value_tag, index_tag); });
    });
}

}  // namespace gtopk
