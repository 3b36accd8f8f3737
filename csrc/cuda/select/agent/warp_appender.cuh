// Device side: a warp's appends of flagged tile items to a global array (the buffer, the
// staging area), staged in shared memory.
#pragma once

#include <cstdint>

#include "gtopk/select_engine.cuh"
#include "../tuning.cuh"
#include "tiles.cuh"

namespace gtopk::cuda::detail {

// Appends flagged items of tiles at out[*counter...], in no particular order (the selection is
// sorted by index at the end), without synchronising the block: each warp stages its flagged
// items in its own kStaged slots of shared memory and reserves room in the output with one
// global atomic per kStaged-ish entries (flush), so a warp rarely waits on a global atomic
// between tiles. A tile whose flagged items do not fit the staging area goes straight to the
// output. Slots at or past capacity are counted but not written. Every lane of a warp makes the
// same calls (add once per tile, flush once at the end): `staged` is the same in every lane.
constexpr int kWarps = kThreads / 32;
constexpr unsigned kStaged = 64;
constexpr unsigned kFullWarp = 0xFFFFFFFFu;

template <typename T, typename Index> struct StagingArea {
    Index index[kWarps][kStaged];
    T value[kWarps][kStaged];
};

template <typename T, typename Index> struct WarpAppender {
    Index* staged_index;  // this warp's slots
    T* staged_value;
    unsigned staged;
    u64* counter;
    u64 capacity;
    Index* out_index;
    T* out_value;

    __device__ WarpAppender(StagingArea<T, Index>& area, u64* counter_, u64 capacity_,
                            Index* out_index_, T* out_value_)
        : staged_index(area.index[threadIdx.x / 32]),
          staged_value(area.value[threadIdx.x / 32]),
          staged(0),
          counter(counter_),
          capacity(capacity_),
          out_index(out_index_),
          out_value(out_value_) {}

    // One global atomic by one lane for `total` entries; every lane gets the first slot.
    __device__ u64 reserve(unsigned total) const {
        u64 base = 0;
        if ((threadIdx.x & 31) == 0) base = atomicAdd(counter, static_cast<u64>(total));
        return __shfl_sync(kFullWarp, base, 0);
    }

    __device__ void put(u64 slot, Index index, T value) const {
        if (slot < capacity) {
            out_index[slot] = index;
            out_value[slot] = value;
        }
    }

    // Moves the staged entries to the output.
    __device__ void flush() {
        if (staged == 0) return;
        __syncwarp();
        const u64 base = reserve(staged);
        for (unsigned s = threadIdx.x & 31; s < staged; s += 32) {
            put(base + s, staged_index[s], staged_value[s]);
        }
        __syncwarp();
        staged = 0;
    }

    template <typename Entries>
    __device__ void add(const bool (&flag)[kItems<T>], const TileItems<T>& items,
                        const Entries& entries) {
        unsigned count = 0;
#pragma unroll
        for (int j = 0; j < kItems<T>; ++j) count += flag[j] ? 1u : 0u;
        if (!__any_sync(kFullWarp, count != 0)) return;
        const unsigned lane = threadIdx.x & 31;
        unsigned inclusive = count;
#pragma unroll
        for (int delta = 1; delta < 32; delta <<= 1) {
            const unsigned below = __shfl_up_sync(kFullWarp, inclusive, delta);
            if (lane >= static_cast<unsigned>(delta)) inclusive += below;
        }
        const unsigned total = __shfl_sync(kFullWarp, inclusive, 31);
        const unsigned offset = inclusive - count;
        if (staged + total > kStaged) flush();
        if (total > kStaged) {
            u64 slot = reserve(total) + offset;
#pragma unroll
            for (int j = 0; j < kItems<T>; ++j) {
                if (flag[j]) {
                    put(slot, static_cast<Index>(entries.index(items.position(j))),
                        items.value[j]);
                    ++slot;
                }
            }
            return;
        }
        unsigned s = staged + offset;
#pragma unroll
        for (int j = 0; j < kItems<T>; ++j) {
            if (flag[j]) {
                staged_index[s] = static_cast<Index>(entries.index(items.position(j)));
                staged_value[s] = items.value[j];
                ++s;
            }
        }
        __syncwarp();
        staged += total;
    }
};

}  // namespace gtopk::cuda::detail
