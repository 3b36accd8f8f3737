// gtopk::cuda::accumulate_count and threshold_indices: the threshold selection of MiCRO and
// ExDyna on the GPU, in two calls (the count sizes the output of the second).
//
// accumulate_count: one pass over d (read gradient and residual, write residual, and gradient
//   when clearing it). Inside [begin, end) each entry's magnitude key is compared with the
//   histogram's base and the threshold in registers: the histogram is counted in shared memory
//   per block (n_bins <= kSharedBins; global atomics beyond) and flushed once per block, and the
//   entries at or above the threshold are counted (one shared atomic per thread, one global per
//   block). Counts and histogram come back to the host in one copy: the stream is
//   synchronised.
// threshold_indices: cub::DeviceSelect::If over the indices [begin, end) with the predicate
//   key(x[i]) >= threshold, which keeps the input order: one read of the partition, a single
//   pass (decoupled look-back) writing the indices in order, through an output that drops the
//   writes at or beyond the output's capacity (the count still counts them).
// Together: one pass over d and one read of the worker's partition, d / P entries.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include <cub/device/device_select.cuh>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/tabulate_output_iterator.h>

#include "cuda_check.cuh"
#include "gtopk/cuda_ops.h"
#include "gtopk/histogram_bins.h"
#include "select/agent/tiles.cuh"
#include "select/dispatch/grid.cuh"
#include "select/dispatch/types.cuh"
#include "select/tuning.cuh"

namespace gtopk::cuda {
namespace {

using detail::KeyOf;
using detail::kThreads;
using detail::u64;

constexpr int64_t kSharedBins = 4096;  // 16 KiB of 32-bit counters per block

// The entries of accumulate_count's pass, counted from `first`: residual += gradient as they
// are read (and gradient = 0 when clearing), or the residual as it is (gradient null). A value
// source of detail::for_each_tile: the tile's loads go out together, the writes after them.
template <typename T> struct CountedEntries {
    T* gradient;
    T* residual;
    int64_t first;
    bool clear_gradient;
    __device__ T value(int64_t i) const {
        const int64_t at = first + i;
        return gradient != nullptr ? residual[at] + gradient[at] : residual[at];
    }
    __device__ void keep(int64_t i, T v) const {
        if (gradient == nullptr) return;
        residual[first + i] = v;
        if (clear_gradient) gradient[first + i] = T(0);
    }
};

// residual += gradient over [0, d) (gradient = 0 too when clear_gradient; gradient == nullptr:
// neither, and only [begin, end) is read); over [begin, end):
// histogram[bin(key)] += 1 where key >= bins.base, *selected += 1 where key >= threshold.
// Every block of the grid covers at most 2^30 entries (tile_grid), so its 32-bit counters hold.
template <typename T>
__global__ void __launch_bounds__(kThreads, detail::kMinBlocksPerSm)
accumulate_count_kernel(T* gradient, T* residual, int64_t d, int64_t begin, int64_t end,
                        KeyOf<T> threshold, HistogramBins<KeyOf<T>> bins, bool clear_gradient,
                        bool shared_bins, u64* histogram, u64* selected) {
    extern __shared__ unsigned int block_bins[];
    __shared__ unsigned int block_selected;
    if (shared_bins) {
        for (int64_t b = threadIdx.x; b < bins.n_bins; b += blockDim.x) block_bins[b] = 0;
    }
    if (threadIdx.x == 0) block_selected = 0;
    __syncthreads();
    unsigned int mine = 0;
    const bool accumulate = gradient != nullptr;  // else: read [begin, end) of residual only
    const int64_t first = accumulate ? 0 : begin, last = accumulate ? d : end;
    const CountedEntries<T> entries{gradient, residual, first, clear_gradient};
    detail::for_each_tile<T>(entries, last - first, [&](const detail::TileItems<T>& items) {
#pragma unroll
        for (int j = 0; j < detail::kItems<T>; ++j) {
            const int64_t i = first + items.position(j);
            if (!items.valid[j] || i < begin || i >= end) continue;
            const KeyOf<T> key = magnitude_key(items.value[j]);
            if (key < bins.base) continue;
            const int64_t bin = bins.of(key);
            if (shared_bins) {
                atomicAdd(&block_bins[bin], 1u);
            } else {
                atomicAdd(&histogram[bin], u64{1});
            }
            mine += key >= threshold ? 1u : 0u;
        }
    });
    if (mine != 0) atomicAdd(&block_selected, mine);
    __syncthreads();
    if (shared_bins) {
        for (int64_t b = threadIdx.x; b < bins.n_bins; b += blockDim.x) {
            if (block_bins[b] != 0) atomicAdd(&histogram[b], u64{block_bins[b]});
        }
    }
    if (threadIdx.x == 0 && block_selected != 0) atomicAdd(selected, u64{block_selected});
}

template <typename T, typename Index> struct AtOrAbove {
    const T* x;
    KeyOf<T> threshold;
    __device__ bool operator()(Index i) const { return magnitude_key(x[i]) >= threshold; }
};

// The output of threshold_indices: the selected index at position i goes to out[i] when
// i < capacity, else nowhere.
template <typename Index> struct WriteBelow {
    Index* out;
    int64_t capacity;
    __device__ void operator()(std::ptrdiff_t i, Index index) const {
        if (i < capacity) out[i] = index;
    }
};

template <typename Index> auto bounded_output(Index* out, int64_t capacity) {
    return thrust::make_tabulate_output_iterator(WriteBelow<Index>{out, capacity});
}

// Workspace of accumulate_count: the histogram and the selected count, as u64.
struct CountLayout {
    size_t histogram, selected, bytes;
    explicit CountLayout(int64_t n_bins) {
        detail::Layout layout;
        histogram = layout.add<u64>(n_bins);
        selected = layout.add<u64>(1);
        bytes = layout.bytes();
    }
};

// Workspace of threshold_indices: CUB's temporary storage, then the selected count.
template <typename T, typename Index> struct SelectLayout {
    size_t cub_bytes = 0, temp, selected, bytes;
    explicit SelectLayout(int64_t n) {
        GTOPK_CUDA_CHECK(cub::DeviceSelect::If(
            nullptr, cub_bytes, thrust::counting_iterator<Index>(0),
            bounded_output<Index>(nullptr, 0), static_cast<int64_t*>(nullptr), n,
            AtOrAbove<T, Index>{nullptr, 0}));
        detail::Layout layout;
        temp = layout.add<char>(static_cast<int64_t>(cub_bytes));
        selected = layout.add<int64_t>(1);
        bytes = layout.bytes();
    }
};

template <typename T>
int64_t accumulate_count_typed(void* gradient, void* residual, int64_t d, int64_t begin,
                               int64_t end, uint64_t threshold, uint64_t histogram_base,
                               int histogram_shift, int64_t n_bins, int64_t n_fine,
                               int coarse_shift, bool clear_gradient, int64_t* histogram,
                               cudaStream_t stream, const Workspace& workspace,
                               int64_t* device_counts) {
    using Key = KeyOf<T>;
    check_keys_fit<Key>(threshold, histogram_base);
    const Key base = static_cast<Key>(histogram_base);
    const Key at_or_above = std::max(static_cast<Key>(threshold), base);
    const auto bins = HistogramBins<Key>::make(base, histogram_shift, n_bins, n_fine,
                                               coarse_shift);
    const CountLayout layout(n_bins);
    u64 selected = 0;
    static_assert(sizeof(u64) == sizeof(int64_t), "histogram counters are 64-bit");
    // Left on the device: the caller's n_bins + 1 counters take the histogram and the count.
    const size_t scratch_bytes = device_counts != nullptr ? 0 : layout.bytes;
    detail::with_workspace(workspace, scratch_bytes, stream, [&](const Workspace& scratch) {
        u64* device_histogram = device_counts != nullptr
                                    ? reinterpret_cast<u64*>(device_counts)
                                    : detail::piece<u64>(scratch, layout.histogram);
        u64* device_selected = device_counts != nullptr
                                   ? reinterpret_cast<u64*>(device_counts) + n_bins
                                   : detail::piece<u64>(scratch, layout.selected);
        if (device_counts != nullptr) {
            GTOPK_CUDA_CHECK(cudaMemsetAsync(device_counts, 0, (n_bins + 1) * sizeof(u64),
                                             stream));
        } else {
            GTOPK_CUDA_CHECK(cudaMemsetAsync(scratch.data, 0, layout.bytes, stream));
        }
        if (d > 0) {
            const bool shared_bins = n_bins <= kSharedBins;
            const size_t shared_bytes = shared_bins ? n_bins * sizeof(unsigned int) : 0;
            const int grid = detail::tile_grid<T>(accumulate_count_kernel<T>, d);
            accumulate_count_kernel<T><<<grid, kThreads, shared_bytes, stream>>>(
                static_cast<T*>(gradient), static_cast<T*>(residual), d, begin, end,
                at_or_above, bins, clear_gradient, shared_bins, device_histogram,
                device_selected);
            GTOPK_CUDA_CHECK_LAUNCH("accumulate_count_kernel");
        }
        if (device_counts != nullptr) return;
        // The histogram and the count in one copy (one transfer, one wait).
        std::vector<unsigned char> host(layout.bytes);
        GTOPK_CUDA_CHECK(cudaMemcpyAsync(host.data(), scratch.data, layout.bytes,
                                         cudaMemcpyDeviceToHost, stream));
        GTOPK_CUDA_CHECK(cudaStreamSynchronize(stream));
        std::memcpy(histogram, host.data() + layout.histogram, n_bins * sizeof(u64));
        std::memcpy(&selected, host.data() + layout.selected, sizeof(u64));
    });
    return device_counts != nullptr ? -1 : static_cast<int64_t>(selected);
}

template <typename T, typename Index>
int64_t threshold_indices_typed(const void* x, int64_t begin, int64_t end, uint64_t threshold,
                                void* out_index, int64_t capacity, cudaStream_t stream,
                                const Workspace& workspace, int64_t* device_count) {
    check_keys_fit<KeyOf<T>>(threshold);
    const int64_t n = end - begin;
    if (n <= 0) {
        if (device_count == nullptr) return 0;
        GTOPK_CUDA_CHECK(cudaMemsetAsync(device_count, 0, sizeof(int64_t), stream));
        return -1;
    }
    const SelectLayout<T, Index> layout(n);
    int64_t selected = 0;
    detail::with_workspace(workspace, layout.bytes, stream, [&](const Workspace& scratch) {
        int64_t* device_selected = device_count != nullptr
                                       ? device_count
                                       : detail::piece<int64_t>(scratch, layout.selected);
        size_t cub_bytes = layout.cub_bytes;
        GTOPK_CUDA_CHECK(cub::DeviceSelect::If(
            detail::piece<char>(scratch, layout.temp), cub_bytes,
            thrust::counting_iterator<Index>(static_cast<Index>(begin)),
            bounded_output<Index>(static_cast<Index*>(out_index), capacity), device_selected, n,
            AtOrAbove<T, Index>{static_cast<const T*>(x), static_cast<KeyOf<T>>(threshold)},
            stream));
        if (device_count != nullptr) return;
        GTOPK_CUDA_CHECK(cudaMemcpyAsync(&selected, device_selected, sizeof(int64_t),
                                         cudaMemcpyDeviceToHost, stream));
        GTOPK_CUDA_CHECK(cudaStreamSynchronize(stream));
    });
    return device_count != nullptr ? -1 : selected;
}

void require_range(int64_t begin, int64_t end, int64_t d, const char* what) {
    if (d < 0 || begin < 0 || end < begin || end > d) {
        throw std::invalid_argument(std::string("gtopk::cuda::") + what +
                                    ": need 0 <= begin <= end <= d, got begin " +
                                    std::to_string(begin) + ", end " + std::to_string(end) +
                                    ", d " + std::to_string(d));
    }
}

}  // namespace

size_t accumulate_count_workspace_bytes(int64_t n_bins) {
    return CountLayout(std::max<int64_t>(n_bins, 1)).bytes;
}

int64_t accumulate_count(ValueType value_type, void* gradient, void* residual, int64_t d,
                         int64_t begin, int64_t end, uint64_t threshold,
                         uint64_t histogram_base, int histogram_shift, int64_t n_bins,
                         int64_t n_fine, int coarse_shift, bool clear_gradient,
                         int64_t* histogram, void* stream, Workspace workspace,
                         int64_t* device_counts) {
    require_range(begin, end, d, "accumulate_count");
    check_histogram_arguments(n_bins, n_fine, histogram_shift, coarse_shift);
    const auto s = static_cast<cudaStream_t>(stream);
    return detail::with_types<false>(value_type, IndexType::kInt64, "accumulate_count",
                                     [&](auto v, auto) {
        return accumulate_count_typed<decltype(v)>(gradient, residual, d, begin, end, threshold,
                                                   histogram_base, histogram_shift, n_bins,
                                                   n_fine, coarse_shift, clear_gradient,
                                                   histogram, s, workspace, device_counts);
    });
}

size_t threshold_indices_workspace_bytes(ValueType value_type, IndexType index_type,
                                         int64_t n) {
    if (n <= 0) return 0;
    return detail::with_types<false>(value_type, index_type, "threshold_indices_workspace_bytes",
                                     [&](auto v, auto i) {
        return SelectLayout<decltype(v), decltype(i)>(n).bytes;
    });
}

int64_t threshold_indices(ValueType value_type, IndexType index_type, const void* x, int64_t d,
                          int64_t begin, int64_t end, uint64_t threshold, void* out_index,
                          int64_t capacity, void* stream, Workspace workspace,
                          int64_t* device_count) {
    require_range(begin, end, d, "threshold_indices");
    if (capacity < 0) {
        throw std::invalid_argument("gtopk::cuda::threshold_indices: capacity must be >= 0");
    }
    detail::require_index_fits(index_type, d);
    const auto s = static_cast<cudaStream_t>(stream);
    return detail::with_types<false>(value_type, index_type, "threshold_indices",
                                     [&](auto v, auto i) {
        return threshold_indices_typed<decltype(v), decltype(i)>(x, begin, end, threshold,
                                                                 out_index, capacity, s,
                                                                 workspace, device_count);
    });
}

}  // namespace gtopk::cuda
