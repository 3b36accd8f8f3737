// Error-feedback residual kernels: the fused accumulate-and-select pass, and the restore step.
#include <cstddef>

#include "gtopk/cpu_ops.h"
#include "select_engine.h"

namespace gtopk::cpu {
namespace {

// residual += gradient while the selection engine reads the block for the first time.
template <typename T> struct AccumulateSource {
    static constexpr bool kHasSideEffects = true;
    const T* gradient;
    T* residual;
    const T* block(int64_t begin, int64_t n) {
        T* r = residual + begin;
        const T* g = gradient + begin;
        for (int64_t j = 0; j < n; ++j) r[j] += g[j];
        return r;
    }
    // Value of position i after the pass; valid before the pass only (used for sampling).
    T at(int64_t i) const { return residual[i] + gradient[i]; }
    const T* values() const { return residual; }
};

}  // namespace

template <typename T, typename Index>
int64_t accumulate_select(const T* gradient, T* residual, int64_t d, int64_t k,
                          const T* threshold_hint, Index* out_index, T* out_value) {
    AccumulateSource<T> source{gradient, residual};
    const int64_t n = detail::select_topk<T, Index>(source, d, k, threshold_hint, out_index,
                                                    out_value);
    for (int64_t j = 0; j < n; ++j) residual[out_index[j]] = T(0);
    return n;
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
    template int64_t accumulate_select<T, Index>(const T*, T*, int64_t, int64_t, const T*,     \
                                                 Index*, T*);                                  \
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
