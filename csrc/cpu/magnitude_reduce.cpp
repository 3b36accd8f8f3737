// Read-only reductions over magnitude keys (the non-finite check, the first threshold's
// window) and the sorted union of two index sets (exact gTop-k's taken entries).
#include <algorithm>
#include <iterator>
#include <type_traits>

#include "gtopk/cpu_ops.h"
#include "select_engine.h"

namespace gtopk::cpu {
namespace {

// The key of x[i] (+ y[i]); 0 when finite_only and the value is not finite.
template <typename T>
uint64_t key_at(const T* x, const T* y, int64_t i, uint64_t first_nonfinite, bool finite_only) {
    uint64_t key;
    if constexpr (std::is_floating_point_v<T>) {
        key = magnitude_key(y != nullptr ? T(x[i] + y[i]) : x[i]);
    } else {
        key = magnitude_key(x[i]);
    }
    return finite_only && key >= first_nonfinite ? 0 : key;
}

}  // namespace

template <typename T>
uint64_t max_key(const T* x, const T* y, int64_t n, bool finite_only) {
    const uint64_t first_nonfinite = MagnitudeTraits<T>::kCanonicalNan - 1;  // key of +inf
    const int n_threads = detail::threads_for(n);
    uint64_t largest = 0;
#pragma omp parallel for num_threads(n_threads) reduction(max : largest) schedule(static)
    for (int64_t i = 0; i < n; ++i) {
        largest = std::max(largest, key_at(x, y, i, first_nonfinite, finite_only));
    }
    return largest;
}

template <typename Index>
int64_t sorted_union(const Index* a, int64_t n_a, const Index* b, int64_t n_b, Index* out) {
    return std::set_union(a, a + n_a, b, b + n_b, out) - out;
}

template uint64_t max_key<float>(const float*, const float*, int64_t, bool);
template uint64_t max_key<double>(const double*, const double*, int64_t, bool);
template uint64_t max_key<float16_bits>(const float16_bits*, const float16_bits*, int64_t, bool);
template uint64_t max_key<bfloat16_bits>(const bfloat16_bits*, const bfloat16_bits*, int64_t,
                                         bool);
template int64_t sorted_union<int32_t>(const int32_t*, int64_t, const int32_t*, int64_t,
                                       int32_t*);
template int64_t sorted_union<int64_t>(const int64_t*, int64_t, const int64_t*, int64_t,
                                       int64_t*);

}  // namespace gtopk::cpu
