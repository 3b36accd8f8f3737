// Sparse merge with re-selection: union of two index-sorted sets, values summed, then top-k.
#include <cmath>
#include <limits>
#include <vector>

#include "gtopk/cpu_ops.h"
#include "select_engine.h"

namespace gtopk::cpu {
namespace {

// a + b, with every NaN result made the same quiet NaN so that the sum does not depend on
// operand order (x86 keeps the first operand's NaN payload).
template <typename T> T symmetric_sum(T a, T b) {
    const T sum = a + b;
    return std::isnan(sum) ? std::numeric_limits<T>::quiet_NaN() : sum;
}

}  // namespace

template <typename T, typename Index>
int64_t merge_topk(const Index* index_a, const T* value_a, int64_t n_a, const Index* index_b,
                   const T* value_b, int64_t n_b, int64_t k, Index* out_index, T* out_value) {
    std::vector<Index> union_index;
    std::vector<T> union_value;
    union_index.reserve(n_a + n_b);
    union_value.reserve(n_a + n_b);
    int64_t a = 0, b = 0;
    while (a < n_a || b < n_b) {
        if (b == n_b || (a < n_a && index_a[a] < index_b[b])) {
            union_index.push_back(index_a[a]);
            union_value.push_back(value_a[a++]);
        } else if (a == n_a || index_b[b] < index_a[a]) {
            union_index.push_back(index_b[b]);
            union_value.push_back(value_b[b++]);
        } else {
            union_index.push_back(index_a[a]);
            union_value.push_back(symmetric_sum(value_a[a++], value_b[b++]));
        }
    }
    // Positions in the union are in index order, so the engine's tie rule (smaller position
    // first) is the tie rule on indices.
    const int64_t n_union = static_cast<int64_t>(union_value.size());
    std::vector<int64_t> position(std::min(k, n_union));
    detail::ReadSource<T> source{union_value.data()};
    const int64_t n = detail::select_topk<T, int64_t>(source, n_union, k, nullptr,
                                                      position.data(), out_value);
    for (int64_t j = 0; j < n; ++j) out_index[j] = union_index[position[j]];
    return n;
}

#define GTOPK_INSTANTIATE(T, Index)                                                            \
    template int64_t merge_topk<T, Index>(const Index*, const T*, int64_t, const Index*,       \
                                          const T*, int64_t, int64_t, Index*, T*);
GTOPK_INSTANTIATE(float, int32_t)
GTOPK_INSTANTIATE(float, int64_t)
GTOPK_INSTANTIATE(double, int32_t)
GTOPK_INSTANTIATE(double, int64_t)
#undef GTOPK_INSTANTIATE

}  // namespace gtopk::cpu
