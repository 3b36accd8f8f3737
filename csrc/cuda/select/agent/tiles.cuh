// Device side: the entries a pass reads (the input through a value source, or the buffer) and
// the block's walk over them, one tile of kThreads x kItems entries at a time.
#pragma once

#include <cstdint>

#include "gtopk/select_engine.cuh"
#include "../tuning.cuh"

namespace gtopk::cuda::detail {

// An entry source: value(i) and index(i) of the i-th entry; keep(i, v) writes back what reading
// it changed (a value source's keep).
template <typename T, typename Values> struct InputEntries {
    Values values;
    __device__ T value(int64_t i) const { return values.load(i); }
    __device__ void keep(int64_t i, T v) const { values.keep(i, v); }
    __device__ u64 index(int64_t i) const { return static_cast<u64>(i); }
};

template <typename T, typename Index> struct BufferEntries {
    const Index* indices;
    const T* values;
    __device__ T value(int64_t i) const { return values[i]; }
    __device__ void keep(int64_t, T) const {}
    __device__ u64 index(int64_t i) const { return static_cast<u64>(indices[i]); }
};

// One thread's items of a tile: item j is entry first + j * kThreads.
template <typename T> struct TileItems {
    int64_t first;
    T value[kItems<T>];
    bool valid[kItems<T>];
    __device__ int64_t position(int j) const { return first + int64_t{j} * kThreads; }
};

// Loads the tile of items from entry `first` on (every item valid when Full, else those below
// count), writes them back (entries.keep) once every load was issued, and visits them.
template <bool Full, typename T, typename Entries, typename Visit>
__device__ __forceinline__ void visit_tile(const Entries& entries, int64_t count, int64_t first,
                                           Visit& visit) {
    TileItems<T> items;
    items.first = first;
#pragma unroll
    for (int j = 0; j < kItems<T>; ++j) {
        const int64_t i = items.position(j);
        items.valid[j] = Full || i < count;
        items.value[j] = items.valid[j] ? entries.value(i) : T{};
    }
#pragma unroll
    for (int j = 0; j < kItems<T>; ++j) {
        if (items.valid[j]) entries.keep(items.position(j), items.value[j]);
    }
    visit(items);
}

// Calls visit(items) once per tile of kTile entries, for the block's tiles of [0, count).
// Every thread of the block makes the same calls, so visit may synchronise. All loads of a tile
// are issued before any is used or written back (entries.keep). A full tile is visited in a
// copy of visit that knows every item is valid (no bound check per item).
template <typename T, typename Entries, typename Visit>
__device__ __forceinline__ void for_each_tile(const Entries& entries, int64_t count,
                                              Visit&& visit) {
    const int64_t tiles = (count + kTile<T> - 1) / kTile<T>;
    for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const int64_t first = tile * kTile<T> + threadIdx.x;
        if ((tile + 1) * kTile<T> <= count) {
            visit_tile<true, T>(entries, count, first, visit);
        } else {
            visit_tile<false, T>(entries, count, first, visit);
        }
    }
}

}  // namespace gtopk::cuda::detail
