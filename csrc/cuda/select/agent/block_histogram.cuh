// Device side: a block's digit histogram in shared memory (the first digit's count of a tile:
// count_first_digit), its flush to the global histogram, the bin of a rank in the global
// histogram (find_bin) and the prefix narrowed to that bin (narrow_to_bin).
#pragma once

#include <cub/block/block_scan.cuh>

#include "gtopk/select_engine.cuh"
#include "../tuning.cuh"
#include "digits.cuh"
#include "tiles.cuh"

namespace gtopk::cuda::detail {

__device__ __forceinline__ void clear_shared(unsigned* histogram, int bins) {
    for (int b = threadIdx.x; b < bins; b += blockDim.x) histogram[b] = 0;
    __syncthreads();
}

__device__ __forceinline__ void flush_shared(const unsigned* histogram, int bins, u64* global) {
    __syncthreads();
    for (int b = threadIdx.x; b < bins; b += blockDim.x) {
        if (histogram[b] != 0) atomicAdd(&global[b], static_cast<u64>(histogram[b]));
    }
}

// Adds a thread's valid items of a tile to the block's first-digit histogram in shared memory,
// except zero keys, counted in `zeros` instead (sparse inputs would otherwise serialise on bin
// 0's counter): the caller adds that count to bin 0 once per block.
template <typename T>
__device__ __forceinline__ void count_first_digit(const TileItems<T>& items, const Level& first,
                                                  unsigned* histogram, unsigned& zeros) {
#pragma unroll
    for (int j = 0; j < kItems<T>; ++j) {
        if (!items.valid[j]) continue;
        const u64 key = magnitude_key(items.value[j]);
        if (key == 0) {
            ++zeros;
        } else {
            atomicAdd(&histogram[digit_of(first, key, 0)], 1u);
        }
    }
}

struct BinChoice {
    int bin;
    u64 above;   // entries in bins above it
    u64 in_bin;  // entries in it
};

// The bin holding the rank-th largest entry (rank >= 1, from the top) of a histogram.
// Call with one block of kThreads threads; the result is valid in every thread. The histogram is
// read through L2 (__ldcg): other blocks of the calling kernel may have just added to it.
static __device__ BinChoice find_bin(const u64* histogram, int bins, u64 rank) {
    using BlockScan = cub::BlockScan<u64, kThreads>;
    __shared__ typename BlockScan::TempStorage scan_storage;
    __shared__ BinChoice choice;
    // Thread t owns the bins at positions [t * per, (t + 1) * per) counted from the top.
    const int per = (bins + kThreads - 1) / kThreads;
    const int begin = min(bins, static_cast<int>(threadIdx.x) * per);
    const int end = min(bins, begin + per);
    u64 sum = 0;
    for (int p = begin; p < end; ++p) sum += __ldcg(&histogram[bins - 1 - p]);
    u64 before = 0;
    BlockScan(scan_storage).ExclusiveSum(sum, before);
    if (threadIdx.x == 0) choice = BinChoice{-1, 0, 0};
    __syncthreads();
    if (before < rank && rank <= before + sum) {
        for (int p = begin; p < end; ++p) {
            const u64 count = __ldcg(&histogram[bins - 1 - p]);
            if (before + count >= rank) {
                choice = BinChoice{bins - 1 - p, before, count};
                break;
            }
            before += count;
        }
    }
    __syncthreads();
    return choice;
}

// Narrows the prefix of s to bin c (c.bin >= 0) of the level's digit and takes the entries of the
// bins above it off the rank: the selection is decided (s.done) when the bin holds exactly the
// entries still wanted.
__device__ __forceinline__ void narrow_to_bin(SelectState& s, const Level& level,
                                              const BinChoice& c) {
    const u64 bin_mask = ((u64{1} << level.bits) - 1) << level.shift;
    const u64 bin_bits = static_cast<u64>(c.bin) << level.shift;
    if (level.on_key) {
        s.key_prefix |= bin_bits;
        s.key_mask |= bin_mask;
    } else {
        s.inv_prefix |= bin_bits;
        s.inv_mask |= bin_mask;
    }
    s.rank -= c.above;
    s.done = s.rank == c.in_bin;
}

}  // namespace gtopk::cuda::detail
