// Host side: the launcher (select_topk_from, select_topk; their contract:
// gtopk/select_engine.cuh). What a kernel file includes to run the engine.
//
// Launches per call, nothing else enqueued: init (zeroes the histograms, starts the state), the
// sample and the retry (guessing only), pass 1, one refine pass per later digit (a pass whose
// level has nothing to do returns at once), stage, and cub's sort. The last block of each
// histogram pass chooses the bin (arrive_last), so no one-block kernel runs between passes.
// Appends to the buffer and the staging area go through per-warp staging in shared memory
// (WarpAppender): no block-wide barrier per tile, and about one global atomic per 64 appended
// entries per warp.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cub/device/device_radix_sort.cuh>
#include <stdexcept>
#include <string>

#include "../../cuda_check.cuh"
#include "../../device.cuh"
#include "gtopk/select_engine.cuh"
#include "../tuning.cuh"
// The agents in the engine's order: the __shared__ variables of device functions (find_bin's,
// arrive_last's, choose_bin's) are laid out in the order they are defined.
#include "../agent/digits.cuh"
#include "../agent/tiles.cuh"
#include "../agent/warp_appender.cuh"
#include "../agent/block_histogram.cuh"
#include "../agent/arrival.cuh"
#include "../agent/start_kernels.cuh"
#include "../agent/choose_bin.cuh"
#include "../agent/first_pass.cuh"
#include "../agent/refine_pass.cuh"
#include "../agent/stage.cuh"
#include "grid.cuh"
#include "plan.cuh"
#include "types.cuh"

namespace gtopk::cuda::detail {

template <typename T, typename Index, typename Values, typename Later, typename AfterSample>
void select_topk_from(const SelectPlan<T, Index>& plan, Values values, Later input,
                      Index* out_index, T* out_value, T* residual_to_zero,
                      const Workspace& workspace, cudaStream_t stream, const int32_t* skip,
                      AfterSample after_sample) {
    if (workspace.bytes < plan.bytes) {
        throw std::logic_error("gtopk: select_topk was given a workspace of " +
                               std::to_string(workspace.bytes) + " bytes, it needs " +
                               std::to_string(plan.bytes));
    }
    const int64_t d = plan.d, n = plan.n, capacity = plan.capacity;
    const int64_t samples = plan.samples, stride = plan.stride, sample_rank = plan.sample_rank;
    const bool guess = plan.guess;
    const Schedule schedule = make_schedule<T>(d);
    const u64 last = static_cast<u64>(d - 1);
    using UIndex = UnsignedOf<Index>;
    using Bits = BitsOf<T>;

    SelectState* state = piece<SelectState>(workspace, plan.at_state);
    u64* histogram = piece<u64>(workspace, plan.at_histogram);
    u64* sample_histogram = piece<u64>(workspace, plan.at_sample_histogram);
    Index* buffer_index = piece<Index>(workspace, plan.at_buffer_index);
    T* buffer_value = piece<T>(workspace, plan.at_buffer_value);
    Index* stage_index = piece<Index>(workspace, plan.at_stage_index);
    T* stage_value = piece<T>(workspace, plan.at_stage_value);

    init_kernel<T><<<1, kThreads, 0, stream>>>(state, static_cast<u64>(n), histogram,
                                               sample_histogram);
    GTOPK_CUDA_CHECK_LAUNCH("init_kernel");

    const Level first = schedule.level[0];
    if (guess) {
        // One sample per thread: the strided loads are all in flight at once.
        const int sample_blocks = static_cast<int>(blocks_for(samples, kThreads));
        sample_guess_kernel<T, Values><<<sample_blocks, kThreads, 0, stream>>>(
            values, stride, samples, first, sample_histogram, static_cast<u64>(sample_rank),
            static_cast<u64>(capacity), state);
        GTOPK_CUDA_CHECK_LAUNCH("sample_guess_kernel");
    }
    after_sample(state, first, stream);

    const u64 all_key_bits = (u64{1} << KeyLayout<T>::kKeyBits) - 1;
    const auto first_kernel = first_pass_kernel<T, Index, Values>;
    first_kernel<<<tile_grid<T>(first_kernel, d), kThreads, 0, stream>>>(
        values, d, first, all_key_bits, state, histogram, buffer_index, buffer_value,
        static_cast<u64>(capacity));
    GTOPK_CUDA_CHECK_LAUNCH("first_pass_kernel");
    if (guess) {
        const auto retry_kernel = first_retry_kernel<T, Later>;
        retry_kernel<<<tile_grid<T>(retry_kernel, d), kThreads, 0, stream>>>(
            input, d, first, all_key_bits, state, histogram, static_cast<u64>(capacity));
        GTOPK_CUDA_CHECK_LAUNCH("first_retry_kernel");
    }

    const auto refine_kernel = refine_pass_kernel<T, Index, Later>;
    const int refine_grid = tile_grid<T>(refine_kernel, d);
    for (int l = 1; l < schedule.count; ++l) {
        refine_kernel<<<refine_grid, kThreads, 0, stream>>>(
            input, d, schedule.level[l], last, all_key_bits, state, histogram, buffer_index,
            buffer_value, static_cast<u64>(capacity));
        GTOPK_CUDA_CHECK_LAUNCH("refine_pass_kernel");
    }

    const auto stage_kernel = stage_selected_kernel<T, Index, Later>;
    stage_kernel<<<tile_grid<T>(stage_kernel, d), kThreads, 0, stream>>>(
        input, d, last, state, buffer_index, buffer_value, static_cast<u64>(capacity),
        stage_index, stage_value, residual_to_zero, skip);
    GTOPK_CUDA_CHECK_LAUNCH("stage_selected_kernel");

    size_t sort_bytes = plan.sort_bytes;
    check_cuda(cub::DeviceRadixSort::SortPairs(
                   piece<char>(workspace, plan.at_sort), sort_bytes,
                   reinterpret_cast<const UIndex*>(stage_index),
                   reinterpret_cast<UIndex*>(out_index), reinterpret_cast<const Bits*>(stage_value),
                   reinterpret_cast<Bits*>(out_value), n, 0, plan.end_bit, stream),
               "cub::DeviceRadixSort::SortPairs", __FILE__, __LINE__);
}

template <typename T, typename Index, typename Values>
void select_topk(const SelectPlan<T, Index>& plan, Values values, const T* input,
                 Index* out_index, T* out_value, T* residual_to_zero, const Workspace& workspace,
                 cudaStream_t stream, const int32_t* skip) {
    select_topk_from<T, Index>(plan, values, ReadValues<T>{input}, out_index, out_value,
                               residual_to_zero, workspace, stream, skip);
}

}  // namespace gtopk::cuda::detail
