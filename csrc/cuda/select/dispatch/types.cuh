// Host side: the C++ types of a call's ValueType and IndexType codes (gtopk/type_dispatch.h, the
// same dispatch as the CPU entries', errors naming gtopk::cuda::<what>), and the index width
// rule (require_index_fits).
#pragma once

#include <utility>

#include "gtopk/type_dispatch.h"

namespace gtopk::cuda::detail {

using gtopk::require_index_fits;

// Calls body(T{}, Index{}) with the C++ types that the codes name; `what` names the caller in
// errors. 16-bit value types are accepted only With16Bit.
template <bool With16Bit, typename Body>
auto with_types(ValueType value_type, IndexType index_type, const char* what, Body&& body) {
    return gtopk::with_types<With16Bit>(value_type, index_type, "gtopk::cuda::", what,
                                        std::forward<Body>(body));
}

}  // namespace gtopk::cuda::detail
