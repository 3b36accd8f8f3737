// Device side: the kernels that start a selection: init_kernel (the state and the histograms)
// and sample_guess_kernel (the guessed first-digit bin).
#pragma once

#include <cstdint>

#include "gtopk/select_engine.cuh"
#include "../tuning.cuh"
#include "digits.cuh"
#include "block_histogram.cuh"
#include "arrival.cuh"

namespace gtopk::cuda::detail {

// Zeroes both histograms and starts the state: wanted = rank = n, nothing known yet.
template <typename T>
__global__ void __launch_bounds__(kThreads) init_kernel(SelectState* state, u64 wanted,
                                                        u64* histogram, u64* sample_histogram) {
    for (int b = threadIdx.x; b < kMaxBins<T>; b += blockDim.x) {
        histogram[b] = 0;
        sample_histogram[b] = 0;
    }
    if (threadIdx.x == 0) {
        SelectState s{};
        s.wanted = wanted;
        s.rank = wanted;
        s.source = kFromInput;
        s.guess_bin = -1;
        *state = s;
    }
}

// Histograms the first digit of `samples` strided keys; the last block then guesses the
// first-digit bin of the n-th largest key: the bin holding the sample_rank-th largest sample,
// kept only if the entries it lets into the buffer should fit.
template <typename T, typename Values>
__global__ void __launch_bounds__(kThreads) sample_guess_kernel(
        Values source, int64_t stride, int64_t samples, Level first, u64* histogram,
        u64 sample_rank, u64 capacity, SelectState* state) {
    __shared__ unsigned shared_histogram[kMaxBins<T>];
    const Values values = on_device(source);
    const int bins = 1 << first.bits;
    clear_shared(shared_histogram, bins);
    for (int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; j < samples;
         j += int64_t{gridDim.x} * blockDim.x) {
        const u64 key = magnitude_key(values.peek(j * stride + stride / 2));
        atomicAdd(&shared_histogram[digit_of(first, key, 0)], 1u);
    }
    flush_shared(shared_histogram, bins, histogram);
    if (!arrive_last(&state->arrivals)) return;
    const BinChoice c = find_bin(histogram, bins, sample_rank);
    if (threadIdx.x == 0) {
        if (c.bin >= 0 && (c.above + c.in_bin) * static_cast<u64>(stride) <= capacity) {
            state->guess_bin = c.bin;
        }
        state->arrivals = 0;
    }
}

}  // namespace gtopk::cuda::detail
