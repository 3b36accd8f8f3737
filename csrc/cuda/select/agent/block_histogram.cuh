// Device side: a block's digit histogram in shared memory, its flush to the global histogram,
// and the bin of a rank in the global histogram (find_bin).
#pragma once

#include <cub/block/block_scan.cuh>

#include "gtopk/select_engine.cuh"
#include "../tuning.cuh"

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

}  // namespace gtopk::cuda::detail
