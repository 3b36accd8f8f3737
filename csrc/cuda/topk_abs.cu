// gtopk::cuda::topk_abs and accumulate_select: exact top-k by magnitude over d device values.
//
// Algorithm (gtopk/select_engine.cuh): radix select on the composite (magnitude key, inverted
// index) with device-side state, so that nothing synchronises:
//   - sample 2^16 keys to guess the first-digit bin of the k-th largest key (k <= d/16 only);
//   - pass 1 over d: first-digit histogram (12 bits of a float32 key, 13 of a float64 key) with
//     per-block shared-memory counters, fused with buffering the entries at or above the guessed
//     bin (capacity ~2k) and, for accumulate_select, with residual += gradient;
//   - the remaining digits run over the buffer (O(k)) when the guess held; otherwise one more
//     pass over d buffers the entries at or above the chosen bin, and only heavy ties (many
//     equal magnitudes) need further passes over d;
//   - the k selected entries are staged (accumulate_select zeroes them in the residual in the
//     same kernel) and sorted by index with cub::DeviceRadixSort.
// Typical inputs: one read of d (accumulate_select: read gradient and residual, write residual),
// plus O(k) work; the target is close to one-read bandwidth for d >= 2^26.
// k >= d returns every entry (one copy pass); k <= 0 or d == 0 returns 0.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>

#include "cuda_check.cuh"
#include "gtopk/cuda_ops.h"
#include "select/dispatch/launch.cuh"

namespace gtopk::cuda {
namespace {

using detail::kThreads;

// Every entry is selected: out = (i, x[i]) for all i.
template <typename T, typename Index>
__global__ void take_all_kernel(const T* x, int64_t d, Index* out_index, T* out_value) {
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < d;
         i += int64_t{gridDim.x} * blockDim.x) {
        out_index[i] = static_cast<Index>(i);
        out_value[i] = x[i];
    }
}

template <typename T>
__global__ void accumulate_kernel(const T* gradient, T* residual, int64_t d,
                                  const int32_t* skip) {
    if (detail::flag_set(skip)) return;
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < d;
         i += int64_t{gridDim.x} * blockDim.x) {
        residual[i] += gradient[i];
    }
}

// Every entry is selected: residual += gradient, out = (i, residual[i]), residual = 0; with the
// skip flag set, out = (i, residual[i]) and the residual is left as it is.
template <typename T, typename Index>
__global__ void accumulate_take_all_kernel(const T* gradient, T* residual, int64_t d,
                                           Index* out_index, T* out_value, const int32_t* skip) {
    const bool skipping = detail::flag_set(skip);
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < d;
         i += int64_t{gridDim.x} * blockDim.x) {
        out_index[i] = static_cast<Index>(i);
        if (skipping) {
            out_value[i] = residual[i];
        } else {
            out_value[i] = residual[i] + gradient[i];
            residual[i] = T(0);
        }
    }
}

int elementwise_grid(int64_t d) {
    return static_cast<int>(std::min<int64_t>(detail::blocks_for(d, kThreads), 1 << 16));
}

int64_t selected_count(int64_t d, int64_t k) {
    return std::clamp<int64_t>(k, 0, std::max<int64_t>(d, 0));
}

// Only the engine (0 < n < d) takes scratch.
template <typename T, typename Index> size_t select_bytes(int64_t d, int64_t k) {
    const int64_t n = selected_count(d, k);
    return n > 0 && n < d ? detail::plan_select<T, Index>(d, n).bytes : 0;
}

template <typename T, typename Index>
int64_t topk_abs_typed(const void* x, int64_t d, int64_t k, void* out_index, void* out_value,
                       cudaStream_t stream, const Workspace& workspace) {
    const int64_t n = selected_count(d, k);
    if (n == 0) return 0;
    const T* values = static_cast<const T*>(x);
    Index* index_out = static_cast<Index*>(out_index);
    T* value_out = static_cast<T*>(out_value);
    if (n == d) {
        take_all_kernel<T, Index>
            <<<elementwise_grid(d), kThreads, 0, stream>>>(values, d, index_out, value_out);
        GTOPK_CUDA_CHECK_LAUNCH("take_all_kernel");
        return n;
    }
    const auto plan = detail::plan_select<T, Index>(d, n);
    detail::with_workspace(workspace, plan.bytes, stream, [&](const Workspace& scratch) {
        detail::select_topk<T, Index>(plan, detail::ReadValues<T>{values}, values, index_out,
                                      value_out, nullptr, scratch, stream);
    });
    return n;
}

template <typename T, typename Index>
int64_t accumulate_select_typed(const void* gradient, void* residual, int64_t d, int64_t k,
                                void* out_index, void* out_value, cudaStream_t stream,
                                const Workspace& workspace, const int32_t* skip) {
    if (d <= 0) return 0;
    const int64_t n = selected_count(d, k);
    const T* g = static_cast<const T*>(gradient);
    T* r = static_cast<T*>(residual);
    Index* index_out = static_cast<Index*>(out_index);
    T* value_out = static_cast<T*>(out_value);
    if (n == 0) {
        accumulate_kernel<T><<<elementwise_grid(d), kThreads, 0, stream>>>(g, r, d, skip);
        GTOPK_CUDA_CHECK_LAUNCH("accumulate_kernel");
        return 0;
    }
    if (n == d) {
        accumulate_take_all_kernel<T, Index>
            <<<elementwise_grid(d), kThreads, 0, stream>>>(g, r, d, index_out, value_out, skip);
        GTOPK_CUDA_CHECK_LAUNCH("accumulate_take_all_kernel");
        return n;
    }
    const auto plan = detail::plan_select<T, Index>(d, n);
    detail::with_workspace(workspace, plan.bytes, stream, [&](const Workspace& scratch) {
        detail::select_topk<T, Index>(plan, detail::AccumulateValues<T>{g, r, skip}, r,
                                      index_out, value_out, r, scratch, stream, skip);
    });
    return n;
}

}  // namespace

size_t select_workspace_bytes(ValueType value_type, IndexType index_type, int64_t d, int64_t k) {
    return detail::with_types<true>(value_type, index_type, "select_workspace_bytes",
                                    [&](auto v, auto i) {
        return select_bytes<decltype(v), decltype(i)>(d, k);
    });
}

int64_t topk_abs(ValueType value_type, IndexType index_type, const void* x, int64_t d, int64_t k,
                 void* out_index, void* out_value, void* stream, Workspace workspace) {
    detail::require_index_fits(index_type, d);
    const auto s = static_cast<cudaStream_t>(stream);
    return detail::with_types<true>(value_type, index_type, "topk_abs", [&](auto v, auto i) {
        return topk_abs_typed<decltype(v), decltype(i)>(x, d, k, out_index, out_value, s,
                                                        workspace);
    });
}

int64_t accumulate_select(ValueType value_type, IndexType index_type, const void* gradient,
                          void* residual, int64_t d, int64_t k, void* out_index, void* out_value,
                          void* stream, Workspace workspace, const int32_t* skip) {
    detail::require_index_fits(index_type, d);
    const auto s = static_cast<cudaStream_t>(stream);
    return detail::with_types<false>(value_type, index_type, "accumulate_select",
                                     [&](auto v, auto i) {
        return accumulate_select_typed<decltype(v), decltype(i)>(gradient, residual, d, k,
                                                                 out_index, out_value, s,
                                                                 workspace, skip);
    });
}

}  // namespace gtopk::cuda
