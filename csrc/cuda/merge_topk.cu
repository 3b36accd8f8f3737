// gtopk::cuda::merge_topk and restore_residual.
//
// merge_topk: the inputs are O(k) entries, so it never reads a dense array of size d.
//   1. Merge by rank: a[i] lands at i + #(b < a[i]), b[j] at j + #(a <= b[j]) of the merged
//      sequence (index order, a before b on equal indices); a[i] carries the sum when b holds its
//      index (NaN sums canonicalised to one quiet NaN, so merge(a, b) == merge(b, a) bit for
//      bit), and the matching b entry is dropped.
//   2. cub::DeviceScan::InclusiveSum over the kept flags gives each kept entry its position in
//      the union, which stays index-sorted.
//   3. Top-min(k, union) of the union by the engine of gtopk/select_engine.cuh (positions in the
//      union order ties exactly as indices do), then positions are mapped back to indices.
//      When one set alone holds k entries (gTop-k's rounds: k and k), the union holds at least
//      k and the result exactly k: the selection runs over the whole merged length, the places
//      past the union set to zero on the device (the smallest key, at later positions than any
//      union entry: never chosen), and nothing waits for the host. Otherwise the union's size
//      comes back to the host first, and the stream is synchronised before returning.
// restore_residual: one elementwise scatter-add over the n entries (indices are unique).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>

#include <cub/device/device_scan.cuh>

#include "cuda_check.cuh"
#include "gtopk/cuda_ops.h"
#include "select/dispatch/launch.cuh"

namespace gtopk::cuda {
namespace {

using detail::kThreads;

template <typename T> struct QuietNan;
template <> struct QuietNan<float> {
    static __device__ float value() { return __int_as_float(0x7FC00000); }
};
template <> struct QuietNan<double> {
    static __device__ double value() { return __longlong_as_double(0x7FF8000000000000LL); }
};

// a + b with every NaN result made the same quiet NaN (the CPU kernels' std::quiet_NaN bits).
template <typename T> __device__ T symmetric_sum(T a, T b) {
    const T sum = a + b;
    return isnan(sum) ? QuietNan<T>::value() : sum;
}

// Number of entries of sorted[0, n) that are < key (or <= key with or_equal).
template <typename Index>
__device__ int64_t count_before(const Index* sorted, int64_t n, Index key, bool or_equal) {
    int64_t lo = 0, hi = n;
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        const bool before = or_equal ? sorted[mid] <= key : sorted[mid] < key;
        if (before) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo;
}

// Places every entry of a and of b at its position of the merged sequence; keep[p] = 0 for the
// b entries whose index a also holds (a's entry carries the sum).
template <typename T, typename Index>
__global__ void merge_by_rank_kernel(const Index* index_a, const T* value_a, int64_t n_a,
                                     const Index* index_b, const T* value_b, int64_t n_b,
                                     Index* merged_index, T* merged_value, int64_t* keep) {
    const int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
    if (t < n_a) {
        const Index index = index_a[t];
        const int64_t before = count_before(index_b, n_b, index, false);
        const bool shared = before < n_b && index_b[before] == index;
        const int64_t p = t + before;
        merged_index[p] = index;
        merged_value[p] = shared ? symmetric_sum(value_a[t], value_b[before]) : value_a[t];
        keep[p] = 1;
    } else if (t < n_a + n_b) {
        const int64_t j = t - n_a;
        const Index index = index_b[j];
        const int64_t before = count_before(index_a, n_a, index, true);
        const bool shared = before > 0 && index_a[before - 1] == index;
        const int64_t p = j + before;
        merged_index[p] = index;
        merged_value[p] = value_b[j];
        keep[p] = shared ? 0 : 1;
    }
}

// union[position[p] - 1] = merged[p] for every kept p (position: inclusive sum of keep).
template <typename T, typename Index>
__global__ void compact_kernel(const Index* merged_index, const T* merged_value,
                               const int64_t* keep, const int64_t* position, int64_t n,
                               Index* union_index, T* union_value) {
    const int64_t p = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
    if (p < n && keep[p]) {
        union_index[position[p] - 1] = merged_index[p];
        union_value[position[p] - 1] = merged_value[p];
    }
}

template <typename Index>
__global__ void gather_index_kernel(const Index* union_index, const Index* position, int64_t n,
                                    Index* out_index) {
    const int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
    if (j < n) out_index[j] = union_index[position[j]];
}

template <typename T, typename Index>
__global__ void restore_kernel(T* residual, const Index* index, const T* value,
                               const uint8_t* restore, int64_t n) {
    const int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
    if (j < n && restore[j]) residual[index[j]] += value[j];
}

// union_value[p] = 0 past the union (p >= its size, the inclusive sum's last entry).
template <typename T>
__global__ void zero_past_union_kernel(const int64_t* position, int64_t n_merged,
                                       T* union_value) {
    const int64_t p = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
    if (p < n_merged && p >= position[n_merged - 1]) union_value[p] = T(0);
}

int grid_for(int64_t n) { return static_cast<int>(detail::blocks_for(n, kThreads)); }

// Where merge_topk's scratch lies in the workspace. The engine's share comes last, sized for the
// largest selection it can be asked for: min(k, n_merged) of at most n_merged union entries.
template <typename T, typename Index> struct MergeLayout {
    size_t scan_bytes;
    size_t at_merged_index, at_merged_value, at_keep, at_position, at_union_index, at_union_value,
        at_selected, at_scan, at_select, bytes;
};

template <typename T, typename Index>
MergeLayout<T, Index> merge_layout(int64_t n_merged, int64_t k) {
    MergeLayout<T, Index> m{};
    detail::check_cuda(cub::DeviceScan::InclusiveSum(nullptr, m.scan_bytes,
                                                     static_cast<const int64_t*>(nullptr),
                                                     static_cast<int64_t*>(nullptr), n_merged),
                       "cub::DeviceScan::InclusiveSum (size query)", __FILE__, __LINE__);
    const int64_t n_max = std::min(k, n_merged);
    detail::Layout layout;
    m.at_merged_index = layout.add<Index>(n_merged);
    m.at_merged_value = layout.add<T>(n_merged);
    m.at_keep = layout.add<int64_t>(n_merged);
    m.at_position = layout.add<int64_t>(n_merged);
    m.at_union_index = layout.add<Index>(n_merged);
    m.at_union_value = layout.add<T>(n_merged);
    m.at_selected = layout.add<Index>(n_max);
    m.at_scan = layout.add<char>(static_cast<int64_t>(m.scan_bytes));
    const size_t select_bytes =
        n_max < n_merged ? detail::select_bytes_bound<T, Index>(n_merged, n_max) : 0;
    m.at_select = layout.add<char>(static_cast<int64_t>(select_bytes));
    m.bytes = layout.bytes();
    return m;
}

template <typename T, typename Index>
int64_t merge_in_workspace(const MergeLayout<T, Index>& layout, const Index* index_a,
                           const T* value_a, int64_t n_a, const Index* index_b, const T* value_b,
                           int64_t n_b, int64_t k, Index* index_out, T* value_out,
                           const Workspace& scratch, cudaStream_t stream) {
    const int64_t n_merged = n_a + n_b;
    Index* merged_index = detail::piece<Index>(scratch, layout.at_merged_index);
    T* merged_value = detail::piece<T>(scratch, layout.at_merged_value);
    int64_t* keep = detail::piece<int64_t>(scratch, layout.at_keep);
    int64_t* position = detail::piece<int64_t>(scratch, layout.at_position);
    Index* union_index = detail::piece<Index>(scratch, layout.at_union_index);
    T* union_value = detail::piece<T>(scratch, layout.at_union_value);
    Index* selected = detail::piece<Index>(scratch, layout.at_selected);

    merge_by_rank_kernel<T, Index><<<grid_for(n_merged), kThreads, 0, stream>>>(
        index_a, value_a, n_a, index_b, value_b, n_b, merged_index, merged_value, keep);
    GTOPK_CUDA_CHECK_LAUNCH("merge_by_rank_kernel");
    size_t scan_bytes = layout.scan_bytes;
    detail::check_cuda(cub::DeviceScan::InclusiveSum(detail::piece<char>(scratch, layout.at_scan),
                                                     scan_bytes, keep, position, n_merged,
                                                     stream),
                       "cub::DeviceScan::InclusiveSum", __FILE__, __LINE__);
    compact_kernel<T, Index><<<grid_for(n_merged), kThreads, 0, stream>>>(
        merged_index, merged_value, keep, position, n_merged, union_index, union_value);
    GTOPK_CUDA_CHECK_LAUNCH("compact_kernel");
    // Select n of the first `count` entries of the union arrays (step 3).
    int64_t count = n_merged, n = k;
    const bool waits = std::max(n_a, n_b) < k;
    if (waits) {
        GTOPK_CUDA_CHECK(cudaMemcpyAsync(&count, position + (n_merged - 1), sizeof(int64_t),
                                         cudaMemcpyDeviceToHost, stream));
        GTOPK_CUDA_CHECK(cudaStreamSynchronize(stream));
        n = std::min(k, count);
    } else if (k < n_merged) {
        zero_past_union_kernel<T><<<grid_for(n_merged), kThreads, 0, stream>>>(
            position, n_merged, union_value);
        GTOPK_CUDA_CHECK_LAUNCH("zero_past_union_kernel");
    }  // else one set is empty and the other holds exactly k: the union is all of it
    if (n == count) {
        GTOPK_CUDA_CHECK(cudaMemcpyAsync(index_out, union_index, n * sizeof(Index),
                                         cudaMemcpyDeviceToDevice, stream));
        GTOPK_CUDA_CHECK(cudaMemcpyAsync(value_out, union_value, n * sizeof(T),
                                         cudaMemcpyDeviceToDevice, stream));
    } else {
        const Workspace engine_scratch{detail::piece<char>(scratch, layout.at_select),
                                       layout.bytes - layout.at_select};
        detail::select_topk<T, Index>(detail::plan_select<T, Index>(count, n),
                                      detail::ReadValues<T>{union_value}, union_value, selected,
                                      value_out, nullptr, engine_scratch, stream);
        gather_index_kernel<Index><<<grid_for(n), kThreads, 0, stream>>>(union_index, selected, n,
                                                                         index_out);
        GTOPK_CUDA_CHECK_LAUNCH("gather_index_kernel");
    }
    if (waits) GTOPK_CUDA_CHECK(cudaStreamSynchronize(stream));
    return n;
}

template <typename T, typename Index>
size_t merge_bytes(int64_t n_a, int64_t n_b, int64_t k) {
    const int64_t n_merged = std::max<int64_t>(n_a, 0) + std::max<int64_t>(n_b, 0);
    return k <= 0 || n_merged == 0 ? 0 : merge_layout<T, Index>(n_merged, k).bytes;
}

template <typename T, typename Index>
int64_t merge_topk_typed(const void* index_a, const void* value_a, int64_t n_a,
                         const void* index_b, const void* value_b, int64_t n_b, int64_t k,
                         void* out_index, void* out_value, cudaStream_t stream,
                         const Workspace& workspace) {
    n_a = std::max<int64_t>(n_a, 0);
    n_b = std::max<int64_t>(n_b, 0);
    const int64_t n_merged = n_a + n_b;
    if (k <= 0 || n_merged == 0) {
        GTOPK_CUDA_CHECK(cudaStreamSynchronize(stream));
        return 0;
    }
    const auto layout = merge_layout<T, Index>(n_merged, k);
    int64_t n = 0;
    detail::with_workspace(workspace, layout.bytes, stream, [&](const Workspace& scratch) {
        n = merge_in_workspace(layout, static_cast<const Index*>(index_a),
                               static_cast<const T*>(value_a), n_a,
                               static_cast<const Index*>(index_b),
                               static_cast<const T*>(value_b), n_b, k,
                               static_cast<Index*>(out_index), static_cast<T*>(out_value),
                               scratch, stream);
    });
    return n;
}

template <typename T>
void restore_residual_for_value(IndexType index_type, void* residual, const void* index,
                                const void* value, const uint8_t* restore, int64_t n,
                                cudaStream_t stream) {
    T* r = static_cast<T*>(residual);
    const T* v = static_cast<const T*>(value);
    switch (index_type) {
        case IndexType::kInt32:
            restore_kernel<T, int32_t><<<grid_for(n), kThreads, 0, stream>>>(
                r, static_cast<const int32_t*>(index), v, restore, n);
            GTOPK_CUDA_CHECK_LAUNCH("restore_kernel");
            return;
        case IndexType::kInt64:
            restore_kernel<T, int64_t><<<grid_for(n), kThreads, 0, stream>>>(
                r, static_cast<const int64_t*>(index), v, restore, n);
            GTOPK_CUDA_CHECK_LAUNCH("restore_kernel");
            return;
    }
    throw std::invalid_argument("gtopk::cuda::restore_residual: unsupported index type");
}

}  // namespace

size_t merge_topk_workspace_bytes(ValueType value_type, IndexType index_type, int64_t n_a,
                                  int64_t n_b, int64_t k) {
    return detail::with_types<false>(value_type, index_type, "merge_topk_workspace_bytes",
                                     [&](auto v, auto i) {
        return merge_bytes<decltype(v), decltype(i)>(n_a, n_b, k);
    });
}

int64_t merge_topk(ValueType value_type, IndexType index_type, const void* index_a,
                   const void* value_a, int64_t n_a, const void* index_b, const void* value_b,
                   int64_t n_b, int64_t k, void* out_index, void* out_value, void* stream,
                   Workspace workspace) {
    const auto s = static_cast<cudaStream_t>(stream);
    return detail::with_types<false>(value_type, index_type, "merge_topk", [&](auto v, auto i) {
        return merge_topk_typed<decltype(v), decltype(i)>(index_a, value_a, n_a, index_b, value_b,
                                                          n_b, k, out_index, out_value, s,
                                                          workspace);
    });
}

void restore_residual(ValueType value_type, IndexType index_type, void* residual,
                      const void* index, const void* value, const uint8_t* restore, int64_t n,
                      void* stream) {
    if (value_type != ValueType::kFloat32 && value_type != ValueType::kFloat64) {
        throw std::invalid_argument(
            "gtopk::cuda::restore_residual: only float32 and float64 values are supported");
    }
    if (index_type != IndexType::kInt32 && index_type != IndexType::kInt64) {
        throw std::invalid_argument("gtopk::cuda::restore_residual: unsupported index type");
    }
    if (n <= 0) return;
    const auto s = static_cast<cudaStream_t>(stream);
    if (value_type == ValueType::kFloat32) {
        restore_residual_for_value<float>(index_type, residual, index, value, restore, n, s);
    } else {
        restore_residual_for_value<double>(index_type, residual, index, value, restore, n, s);
    }
}

}  // namespace gtopk::cuda
