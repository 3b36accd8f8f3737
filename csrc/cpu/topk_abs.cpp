// Exact top-k by magnitude over a dense array (see select_engine.h for the plan).
#include "gtopk/cpu_ops.h"
#include "select_engine.h"

namespace gtopk::cpu {

template <typename T, typename Index>
int64_t topk_abs(const T* x, int64_t d, int64_t k, const T* threshold_hint, Index* out_index,
                 T* out_value) {
    detail::ReadSource<T> source{x};
    return detail::select_topk<T, Index>(source, d, k, threshold_hint, out_index, out_value);
}

#define GTOPK_INSTANTIATE(T, Index)                                                           \
    template int64_t topk_abs<T, Index>(const T*, int64_t, int64_t, const T*, Index*, T*);
GTOPK_INSTANTIATE(float, int32_t)
GTOPK_INSTANTIATE(float, int64_t)
GTOPK_INSTANTIATE(double, int32_t)
GTOPK_INSTANTIATE(double, int64_t)
GTOPK_INSTANTIATE(float16_bits, int32_t)
GTOPK_INSTANTIATE(float16_bits, int64_t)
GTOPK_INSTANTIATE(bfloat16_bits, int32_t)
GTOPK_INSTANTIATE(bfloat16_bits, int64_t)
#undef GTOPK_INSTANTIATE

}  // namespace gtopk::cpu
