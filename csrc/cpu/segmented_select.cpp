// The segmented error-feedback selection on the CPU: the fused per-segment kernel
// (accumulate_select, or topk_abs when the residual already holds the sum) on every segment in
// one call, each segment's entries written at its place in the outputs with indices into the
// whole vector. Segments shorter than kParallelMin (which the per-segment kernel runs on one
// thread) run side by side, one per thread; longer ones one after the other, each with all the
// threads. No temporary beyond the segments' output offsets.
#include <omp.h>

#include <algorithm>
#include <vector>

#include "gtopk/cpu_ops.h"
#include "select_engine.h"

namespace gtopk::cpu {

template <typename T, typename Index>
int64_t segmented_accumulate_select(T* gradient, T* residual, const int64_t* offsets,
                                    const int64_t* ks, int64_t segments, Index* out_index,
                                    T* out_value, bool clear_gradient) {
    std::vector<int64_t> out(static_cast<size_t>(segments) + 1, 0);
    int64_t short_total = 0;
    for (int64_t s = 0; s < segments; ++s) {
        const int64_t length = offsets[s + 1] - offsets[s];
        out[s + 1] = out[s] + std::min(ks[s], length);
        if (length < detail::kParallelMin) short_total += length;
    }
    auto run = [&](int64_t s) {
        const int64_t begin = offsets[s], length = offsets[s + 1] - offsets[s];
        Index* index = out_index + out[s];
        T* value = out_value + out[s];
        int64_t n = 0;
        if (gradient != nullptr) {
            n = accumulate_select<T, Index>(gradient + begin, residual + begin, length, ks[s],
                                            nullptr, index, value, clear_gradient);
        } else {
            n = topk_abs<T, Index>(residual + begin, length, ks[s], nullptr, index, value);
            for (int64_t j = 0; j < n; ++j) residual[begin + index[j]] = T(0);
        }
        for (int64_t j = 0; j < n; ++j) index[j] = static_cast<Index>(index[j] + begin);
    };
    const int threads = short_total >= detail::kParallelMin ? max_threads() : 1;
#pragma omp parallel for schedule(dynamic, 4) num_threads(threads)
    for (int64_t s = 0; s < segments; ++s) {
        if (offsets[s + 1] - offsets[s] < detail::kParallelMin) run(s);
    }
    for (int64_t s = 0; s < segments; ++s) {
        if (offsets[s + 1] - offsets[s] >= detail::kParallelMin) run(s);
    }
    return out[segments];
}

#define GTOPK_INSTANTIATE(T, Index)                                                           \
    template int64_t segmented_accumulate_select<T, Index>(T*, T*, const int64_t*,           \
                                                           const int64_t*, int64_t, Index*,  \
                                                           T*, bool);
GTOPK_INSTANTIATE(float, int32_t)
GTOPK_INSTANTIATE(float, int64_t)
GTOPK_INSTANTIATE(double, int32_t)
GTOPK_INSTANTIATE(double, int64_t)
#undef GTOPK_INSTANTIATE

}  // namespace gtopk::cpu
