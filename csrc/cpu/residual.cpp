// Error-feedback residual kernels: the fused accumulate-and-select pass, and the restore step.
#include <algorithm>
#include <cstddef>

#include "gtopk/cpu_ops.h"
#include "select_engine.h"

namespace gtopk::cpu {
namespace {

// residual += gradient (and gradient = 0 if Clear) while the selection engine reads the block
// for the first time.
template <typename T, bool Clear> struct AccumulateSource {
    static constexpr bool kHasSideEffects = true;
    static constexpr bool kSampledInGroups = false;
    T* gradient;
    T* residual;
    const T* block(int64_t begin, int64_t n) {
        T* r = residual + begin;
        T* g = gradient + begin;
        for (int64_t j = 0; j < n; ++j) r[j] += g[j];
        if constexpr (Clear) std::fill(g, g + n, T(0));
        return r;
    }
    // Value of position i after the pass; valid before the pass only (used for sampling).
    T at(int64_t i) const { return residual[i] + gradient[i]; }
    const T* values() const { return residual; }
};

}  // namespace

template <typename T, typename Index>
int64_t accumulate_select(T* gradient, T* residual, int64_t d, int64_t k,
                          const T* threshold_hint, Index* out_index, T* out_value,
                          bool clear_gradient) {
    auto run = [&](auto source) {
        return detail::select_topk<T, Index>(source, d, k, threshold_hint, out_index, out_value);
    };
    const int64_t n = clear_gradient ? run(AccumulateSource<T, true>{gradient, residual})
                                     : run(AccumulateSource<T, false>{gradient, residual});
    for (int64_t j = 0; j < n; ++j) residual[out_index[j]] = T(0);
    return n;
}

template <typename T, typename Index>
void write_sparse(T* dest, int64_t d, const Index* index, const T* value, int64_t n) {
    const int n_threads = detail::threads_for(d);
#pragma omp parallel num_threads(n_threads)
    {
        const auto [begin, end] = detail::chunk_of(d, omp_get_thread_num(), n_threads);
        std::fill(dest + begin, dest + end, T(0));
        const int64_t first = std::lower_bound(index, index + n, begin) - index;
        for (int64_t j = first; j < n && index[j] < end; ++j) dest[index[j]] = value[j];
    }
}

template <typename T, typename Index>
void restore_residual(T* residual, int64_t /*d*/, const Index* index, const T* value,
                      const uint8_t* restore, int64_t n) {
    for (int64_t j = 0; j < n; ++j) {
        if (restore[j]) residual[index[j]] += value[j];
    }
}

template <typename Index>
void mark_survivors(const Index* local_index, int64_t n_local, const Index* global_index,
                    int64_t n_global, uint8_t* survived) {
    int64_t g = 0;
    for (int64_t j = 0; j < n_local; ++j) {
        while (g < n_global && global_index[g] < local_index[j]) ++g;
        survived[j] = g < n_global && global_index[g] == local_index[j];
    }
}

#define GTOPK_INSTANTIATE(T, Index)                                                            \
    template int64_t accumulate_select<T, Index>(T*, T*, int64_t, int64_t, const T*, Index*,  \
                                                 T*, bool);                                    \
    template void write_sparse<T, Index>(T*, int64_t, const Index*, const T*, int64_t);        \
    template void restore_residual<T, Index>(T*, int64_t, const Index*, const T*,              \
                                             const uint8_t*, int64_t);
GTOPK_INSTANTIATE(float, int32_t)
GTOPK_INSTANTIATE(float, int64_t)
GTOPK_INSTANTIATE(double, int32_t)
GTOPK_INSTANTIATE(double, int64_t)
#undef GTOPK_INSTANTIATE
template void mark_survivors<int32_t>(const int32_t*, int64_t, const int32_t*, int64_t, uint8_t*);
template void mark_survivors<int64_t>(const int64_t*, int64_t, const int64_t*, int64_t, uint8_t*);

}  // namespace gtopk::cpu
