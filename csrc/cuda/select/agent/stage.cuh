// Device side: the selected entries to the staging area (stage_selected_kernel), the residual
// zeroed there.
#pragma once

#include <cstdint>

#include "gtopk/select_engine.cuh"
#include "../tuning.cuh"
#include "digits.cuh"
#include "tiles.cuh"
#include "warp_appender.cuh"

namespace gtopk::cuda::detail {

template <typename T, typename Index, typename Entries>
__device__ void stage_tiles(const Entries& entries, int64_t count, const SelectState& s, u64 last,
                            WarpAppender<T, Index>& appender, T* residual_to_zero) {
    for_each_tile<T>(entries, count, [&](const TileItems<T>& items) {
        bool selected[kItems<T>];
#pragma unroll
        for (int j = 0; j < kItems<T>; ++j) {
            selected[j] = items.valid[j] &&
                          locate(s, magnitude_key(items.value[j]),
                                 last - entries.index(items.position(j))) >= 0;
            // Each entry is read and zeroed by one thread, so zeroing the input (the residual)
            // here cannot change what another thread reads.
            if (selected[j] && residual_to_zero != nullptr) {
                residual_to_zero[entries.index(items.position(j))] = T{};
            }
        }
        appender.add(selected, items, entries);
    });
}

// Appends the selected entries (at or above the final prefix: exactly n) to the staging area;
// with residual_to_zero, residual_to_zero[index] = 0 for each of them, unless the device flag
// `skip` (null: none) is set.
template <typename T, typename Index, typename Later>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm) stage_selected_kernel(
        Later input, int64_t d, u64 last, SelectState* state, const Index* buffer_index,
        const T* buffer_value, u64 capacity, Index* stage_index, T* stage_value,
        T* residual_to_zero, const int32_t* skip) {
    __shared__ StagingArea<T, Index> staging;
    const SelectState s = *state;
    if (flag_set(skip)) residual_to_zero = nullptr;
    WarpAppender<T, Index> appender(staging, &state->staged_count, s.wanted, stage_index,
                                    stage_value);
    if (s.source == kFromBuffer) {
        const BufferEntries<T, Index> entries{buffer_index, buffer_value};
        stage_tiles(entries, static_cast<int64_t>(min(s.buffer_count, capacity)), s, last,
                    appender, residual_to_zero);
    } else {
        const InputEntries<T, Later> entries{input};
        stage_tiles(entries, d, s, last, appender, residual_to_zero);
    }
    appender.flush();
}

}  // namespace gtopk::cuda::detail
