// Device side: the passes of the later digits (refine_pass_kernel), over the input or the
// buffer.
#pragma once

#include <cstdint>

#include "gtopk/select_engine.cuh"
#include "../tuning.cuh"
#include "digits.cuh"
#include "tiles.cuh"
#include "warp_appender.cuh"
#include "block_histogram.cuh"
#include "arrival.cuh"
#include "choose_bin.cuh"

namespace gtopk::cuda::detail {

// The body of a refine pass over one entry source: histogram of the level's digit over the
// entries matching the prefix (if wanted); with collect, entries at or above the prefix are
// appended to the buffer.
template <typename T, typename Index, typename Entries>
__device__ void refine_tiles(const Entries& entries, int64_t count, const SelectState& s,
                             const Level& level, u64 last, bool histogram_wanted,
                             unsigned* shared_histogram, bool collect,
                             WarpAppender<T, Index>& appender) {
    for_each_tile<T>(entries, count, [&](const TileItems<T>& items) {
        bool at_or_above[kItems<T>];
#pragma unroll
        for (int j = 0; j < kItems<T>; ++j) {
            at_or_above[j] = false;
            if (!items.valid[j]) continue;
            const u64 key = magnitude_key(items.value[j]);
            const u64 inv = last - entries.index(items.position(j));
            const int where = locate(s, key, inv);
            if (where == 0 && histogram_wanted) {
                atomicAdd(&shared_histogram[digit_of(level, key, inv)], 1u);
            }
            at_or_above[j] = where >= 0;
        }
        if (collect) appender.add(at_or_above, items, entries);
    });
}

// Passes 2..: histogram of the level's digit over the entries matching the prefix, read from
// wherever they are; a pass over the input with `collect` set also fills the buffer. The last
// block chooses the level's bin. A pass with nothing to do returns at once in every block (and
// leaves the state as it is).
template <typename T, typename Index, typename Later>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm) refine_pass_kernel(
        Later input, int64_t d, Level level, u64 last, u64 all_key_bits, SelectState* state,
        u64* histogram, Index* buffer_index, T* buffer_value, u64 capacity) {
    __shared__ unsigned shared_histogram[kMaxBins<T>];
    __shared__ StagingArea<T, Index> staging;
    const SelectState s = *state;
    const bool histogram_wanted = !s.done && !level_fixed(s, level);
    const bool collect = s.source == kFromInput && s.collect;
    if (!histogram_wanted && !collect) return;
    const int bins = 1 << level.bits;
    clear_shared(shared_histogram, bins);
    WarpAppender<T, Index> appender(staging, &state->buffer_count, capacity, buffer_index,
                                    buffer_value);
    if (s.source == kFromBuffer) {
        const BufferEntries<T, Index> entries{buffer_index, buffer_value};
        const auto count = static_cast<int64_t>(min(s.buffer_count, capacity));
        refine_tiles<T, Index>(entries, count, s, level, last, histogram_wanted,
                               shared_histogram, false, appender);
    } else {
        const InputEntries<T, Later> entries{input};
        refine_tiles<T, Index>(entries, d, s, level, last, histogram_wanted, shared_histogram,
                               collect, appender);
        appender.flush();
    }
    flush_shared(shared_histogram, bins, histogram);
    if (arrive_last(&state->arrivals)) {
        choose_bin(level, false, all_key_bits, histogram, state, capacity);
    }
}

}  // namespace gtopk::cuda::detail
