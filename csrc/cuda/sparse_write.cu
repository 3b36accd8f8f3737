// write_sparse, restore_unselected, zero_at and take_at (gtopk/cuda_ops.h): a sparse set
// written into or taken out of a dense vector on the device, each in one call of at most two
// launches, reading the skip flag there.
//
//   write_sparse:        dest = 0 except dest[index[j]] = value[j]     (all NaN when skipped)
//   zero_at:             x[index[j]] = 0                               (nothing when skipped)
//   restore_unselected:  residual[index[j]] += value[j] for each j whose index is not in the
//                        sorted set `selected`                         (nothing when skipped)
//   take_at:             out[j] = residual[index[j]] (+ the taken value at index[j]), then
//                        residual[index[j]] = 0                        (kept when skipped)
//
// Each replaces a sequence of framework operations (a fill, a where, an index cast, an index
// put; a search, a clamp, a gather, a compare, a mask, a cast, a restore; a gather, a search, a
// clamp, a compare, a where, an index add, a clear; a zero made on the device, a gather, a
// compare, a where, an index put) whose launches, not their bytes, were the cost at the sizes
// of a step's set.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

#include "cuda_check.cuh"
#include "device.cuh"
#include "gtopk/cuda_ops.h"

namespace gtopk::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxFillBlocks = int64_t{1} << 14;

__device__ __forceinline__ bool flag_set(const int32_t* skip) {
    return skip != nullptr && *skip != 0;
}

// zeroed: dest already holds zeros, so only a set flag's NaN fill is left to do.
template <typename T>
__global__ void __launch_bounds__(kThreads) fill_kernel(T* dest, int64_t d, bool zeroed, T nan,
                                                        const int32_t* skip) {
    const bool skipping = flag_set(skip);
    if (zeroed && !skipping) return;
    const T fill = skipping ? nan : T(0);
    for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < d;
         i += int64_t{gridDim.x} * kThreads) {
        dest[i] = fill;
    }
}

template <typename T, typename Index>
__global__ void __launch_bounds__(kThreads) scatter_kernel(T* dest, const Index* index,
                                                           const T* value, int64_t n,
                                                           const int32_t* skip) {
    if (flag_set(skip)) return;  // the fill has written NaN everywhere
    const int64_t j = blockIdx.x * int64_t{kThreads} + threadIdx.x;
    if (j < n) dest[index[j]] = value[j];
}

// The first position p in sorted[0, n) (ascending) with sorted[p] >= x (n if none).
template <typename Index>
__device__ __forceinline__ int64_t lower_bound(const Index* sorted, int64_t n, Index x) {
    int64_t low = 0, high = n;
    while (low < high) {
        const int64_t middle = low + (high - low) / 2;
        if (sorted[middle] < x) {
            low = middle + 1;
        } else {
            high = middle;
        }
    }
    return low;
}

// Whether `x` is in selected[0, n) (sorted ascending).
template <typename Index>
__device__ __forceinline__ bool contains(const Index* selected, int64_t n, Index x) {
    const int64_t p = lower_bound(selected, n, x);
    return p < n && selected[p] == x;
}

template <typename T, typename Index>
__global__ void __launch_bounds__(kThreads) restore_unselected_kernel(
    T* residual, const Index* index, const T* value, int64_t n, const Index* selected,
    int64_t n_selected, const int32_t* skip) {
    if (flag_set(skip)) return;
    const int64_t j = blockIdx.x * int64_t{kThreads} + threadIdx.x;
    if (j < n && !contains(selected, n_selected, index[j])) residual[index[j]] += value[j];
}

template <typename T, typename Index>
__global__ void __launch_bounds__(kThreads) zero_at_kernel(T* x, const Index* index, int64_t n,
                                                           const int32_t* skip) {
    if (flag_set(skip)) return;
    const int64_t j = blockIdx.x * int64_t{kThreads} + threadIdx.x;
    if (j < n) x[index[j]] = T(0);
}

// Thread j: out[j] = residual[i] (+ taken_value[m] if taken_index[m] == i), i = index[j]; then
// residual[i] = 0 unless the flag is set. Each i is one thread's (index is distinct), so the
// clear cannot change what another thread reads.
template <typename T, typename Index>
__global__ void __launch_bounds__(kThreads) take_at_kernel(
    T* residual, const Index* index, int64_t n, const Index* taken_index, const T* taken_value,
    int64_t n_taken, T* out, const int32_t* skip) {
    const int64_t j = blockIdx.x * int64_t{kThreads} + threadIdx.x;
    if (j >= n) return;
    const Index i = index[j];
    T value = residual[i];
    const int64_t m = lower_bound(taken_index, n_taken, i);
    if (m < n_taken && taken_index[m] == i) value += taken_value[m];
    out[j] = value;
    if (!flag_set(skip)) residual[i] = T(0);
}

int blocks_for(int64_t n, int64_t most) {
    return static_cast<int>(std::min(most, (n + kThreads - 1) / kThreads));
}

template <typename T, typename Index>
void write_sparse_typed(void* dest, int64_t d, const void* index, const void* value, int64_t n,
                        bool zeroed, cudaStream_t stream, const int32_t* skip) {
    T* out = static_cast<T*>(dest);
    if (d > 0 && !(zeroed && skip == nullptr)) {
        // Zeroed with a flag: two blocks per multiprocessor, each returning after one read of
        // the flag unless it is set (a skipped step's NaN fill, rare, need not be fast).
        const int blocks = zeroed ? blocks_for(d, 2 * detail::sm_count(detail::current_device()))
                                  : blocks_for(d, kMaxFillBlocks);
        fill_kernel<T><<<blocks, kThreads, 0, stream>>>(out, d, zeroed,
                                                        std::numeric_limits<T>::quiet_NaN(), skip);
        GTOPK_CUDA_CHECK_LAUNCH("fill_kernel");
    }
    if (n > 0) {
        scatter_kernel<T, Index><<<blocks_for(n, std::numeric_limits<int>::max()), kThreads, 0,
                                   stream>>>(out, static_cast<const Index*>(index),
                                             static_cast<const T*>(value), n, skip);
        GTOPK_CUDA_CHECK_LAUNCH("scatter_kernel");
    }
}

template <typename T, typename Index>
void restore_unselected_typed(void* residual, const void* index, const void* value, int64_t n,
                              const void* selected, int64_t n_selected, cudaStream_t stream,
                              const int32_t* skip) {
    restore_unselected_kernel<T, Index><<<blocks_for(n, std::numeric_limits<int>::max()),
                                          kThreads, 0, stream>>>(
        static_cast<T*>(residual), static_cast<const Index*>(index),
        static_cast<const T*>(value), n, static_cast<const Index*>(selected), n_selected, skip);
    GTOPK_CUDA_CHECK_LAUNCH("restore_unselected_kernel");
}

template <typename T, typename Index>
void zero_at_typed(void* x, const void* index, int64_t n, cudaStream_t stream,
                   const int32_t* skip) {
    zero_at_kernel<T, Index><<<blocks_for(n, std::numeric_limits<int>::max()), kThreads, 0,
                               stream>>>(static_cast<T*>(x), static_cast<const Index*>(index),
                                         n, skip);
    GTOPK_CUDA_CHECK_LAUNCH("zero_at_kernel");
}

template <typename T, typename Index>
void take_at_typed(void* residual, const void* index, int64_t n, const void* taken_index,
                   const void* taken_value, int64_t n_taken, void* out, cudaStream_t stream,
                   const int32_t* skip) {
    take_at_kernel<T, Index><<<blocks_for(n, std::numeric_limits<int>::max()), kThreads, 0,
                               stream>>>(
        static_cast<T*>(residual), static_cast<const Index*>(index), n,
        static_cast<const Index*>(taken_index), static_cast<const T*>(taken_value), n_taken,
        static_cast<T*>(out), skip);
    GTOPK_CUDA_CHECK_LAUNCH("take_at_kernel");
}

// f(T{}, Index{}) for the float32 / float64 values and int32 / int64 indices these take.
template <typename F>
void with_value_and_index(ValueType value_type, IndexType index_type, const char* what, F f) {
    const bool float32 = value_type == ValueType::kFloat32;
    if (!float32 && value_type != ValueType::kFloat64) {
        throw std::invalid_argument(std::string("gtopk::cuda::") + what +
                                    ": only float32 and float64 values are supported");
    }
    switch (index_type) {
        case IndexType::kInt32:
            return float32 ? f(float{}, int32_t{}) : f(double{}, int32_t{});
        case IndexType::kInt64:
            return float32 ? f(float{}, int64_t{}) : f(double{}, int64_t{});
    }
    throw std::invalid_argument(std::string("gtopk::cuda::") + what +
                                ": unsupported index type");
}

}  // namespace

void write_sparse(ValueType value_type, IndexType index_type, void* dest, int64_t d,
                  const void* index, const void* value, int64_t n, bool zeroed, void* stream,
                  const int32_t* skip) {
    const auto s = static_cast<cudaStream_t>(stream);
    with_value_and_index(value_type, index_type, "write_sparse", [&](auto v, auto i) {
        write_sparse_typed<decltype(v), decltype(i)>(dest, d, index, value, n, zeroed, s, skip);
    });
}

void restore_unselected(ValueType value_type, IndexType index_type, void* residual,
                        const void* index, const void* value, int64_t n, const void* selected,
                        int64_t n_selected, void* stream, const int32_t* skip) {
    if (n <= 0) return;
    const auto s = static_cast<cudaStream_t>(stream);
    with_value_and_index(value_type, index_type, "restore_unselected", [&](auto v, auto i) {
        restore_unselected_typed<decltype(v), decltype(i)>(residual, index, value, n, selected,
                                                           n_selected, s, skip);
    });
}

void zero_at(ValueType value_type, IndexType index_type, void* x, const void* index, int64_t n,
             void* stream, const int32_t* skip) {
    if (n <= 0) return;
    const auto s = static_cast<cudaStream_t>(stream);
    with_value_and_index(value_type, index_type, "zero_at", [&](auto v, auto i) {
        zero_at_typed<decltype(v), decltype(i)>(x, index, n, s, skip);
    });
}

void take_at(ValueType value_type, IndexType index_type, void* residual, const void* index,
             int64_t n, const void* taken_index, const void* taken_value, int64_t n_taken,
             void* out, void* stream, const int32_t* skip) {
    if (n <= 0) return;
    const auto s = static_cast<cudaStream_t>(stream);
    with_value_and_index(value_type, index_type, "take_at", [&](auto v, auto i) {
        take_at_typed<decltype(v), decltype(i)>(residual, index, n, taken_index, taken_value,
                                                std::max<int64_t>(n_taken, 0), out, s, skip);
    });
}

}  // namespace gtopk::cuda
