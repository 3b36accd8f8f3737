// Device side: a level's decision, run by the last block of its pass (choose_bin).
#pragma once

#include "gtopk/select_engine.cuh"
#include "digits.cuh"
#include "block_histogram.cuh"
#include "arrival.cuh"

namespace gtopk::cuda::detail {

// Run by the last block of a level's pass, after the level's histogram is complete: narrows the
// prefix to the bin holding the wanted rank, decides where the next pass reads from, and clears
// the histogram for the next level.
static __device__ void choose_bin(const Level& level, bool is_first, u64 all_key_bits,
                                  u64* histogram, SelectState* state, u64 capacity) {
    __shared__ SelectState s;
    if (threadIdx.x == 0) {
        s = load_state(state);
        s.arrivals = 0;
        if (is_first) s.redo_first = 0;
        if (s.collect) {  // the pass that just ran filled the buffer
            s.source = kFromBuffer;
            s.collect = 0;
        }
    }
    __syncthreads();
    const int bins = 1 << level.bits;
    if (!s.done && !level_fixed(s, level)) {
        const BinChoice c = find_bin(histogram, bins, s.rank);
        if (threadIdx.x == 0 && c.bin >= 0) {
            narrow_to_bin(s, level, c);
            if (is_first && c.bin == 0 && c.in_bin == s.zero_count) s.key_mask = all_key_bits;
            if (is_first && s.guess_bin >= 0 && c.bin >= s.guess_bin &&
                s.buffer_count <= capacity) {
                s.source = kFromBuffer;
            }
            if (s.source == kFromInput && (s.wanted - s.rank) + c.in_bin <= capacity) {
                s.collect = 1;
                s.buffer_count = 0;
            }
        }
        // A pass 1 with a guess histograms only the bins at or above it: when they hold fewer
        // than the wanted entries, the guess was too high and the first digit is done again
        // over every entry (first_retry_kernel), without a guess.
        if (threadIdx.x == 0 && c.bin < 0 && is_first && s.guess_bin > 0) {
            s.redo_first = 1;
            s.guess_bin = -1;
        }
    }
    __syncthreads();
    for (int b = threadIdx.x; b < bins; b += blockDim.x) histogram[b] = 0;
    if (threadIdx.x == 0) *state = s;
}

}  // namespace gtopk::cuda::detail
