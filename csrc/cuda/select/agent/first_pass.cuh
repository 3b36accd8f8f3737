// Device side: pass 1 over d (first_pass_kernel) and its retry without a guess
// (first_retry_kernel).
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

// The end of a first-digit pass, in every block: the thread's zero keys into bin 0 and the
// block's zero count, the block's histogram into the global one, the block's zeros into
// state->zero_count; the last block to arrive chooses the first digit's bin.
__device__ __forceinline__ void end_first_digit(const Level& first, u64 all_key_bits,
                                                SelectState* state, u64* histogram,
                                                u64 capacity, unsigned* shared_histogram,
                                                unsigned& shared_zeros, unsigned zeros) {
    if (zeros != 0) {
        atomicAdd(&shared_histogram[0], zeros);
        atomicAdd(&shared_zeros, zeros);
    }
    flush_shared(shared_histogram, 1 << first.bits, histogram);
    if (threadIdx.x == 0 && shared_zeros != 0) atomicAdd(&state->zero_count, u64{shared_zeros});
    if (arrive_last(&state->arrivals)) {
        choose_bin(first, true, all_key_bits, histogram, state, capacity);
    }
}

// Pass 1: first-digit histogram; entries with first digit >= the guessed bin go to the buffer;
// the last block chooses the first digit's bin. With a guess (bin g > 0) only the entries of
// digit >= g are histogrammed (the others need no atomic: most of d lies below g); if those bins
// hold fewer than the wanted entries, first_retry_kernel histograms every entry. Zero keys are
// counted in registers (sparse inputs would otherwise serialise on one shared counter) and
// their total is kept: a bin of nothing but zeros needs no more key digits.
template <typename T, typename Index, typename Values>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm) first_pass_kernel(
        Values source, int64_t d, Level first, u64 all_key_bits, SelectState* state,
        u64* histogram, Index* buffer_index, T* buffer_value, u64 capacity) {
    __shared__ unsigned shared_histogram[kMaxBins<T>];
    __shared__ unsigned shared_zeros;
    __shared__ StagingArea<T, Index> staging;
    const Values values = on_device(source);
    const int bins = 1 << first.bits;
    if (threadIdx.x == 0) shared_zeros = 0;
    clear_shared(shared_histogram, bins);
    const int guess_bin = state->guess_bin;
    // With partial, an entry of first digit < guess_bin changes nothing here (not counted, not
    // histogrammed, not buffered): select_topk_from's after_sample contract rests on it.
    const bool partial = guess_bin > 0;
    const InputEntries<T, Values> entries{values};
    WarpAppender<T, Index> appender(staging, &state->buffer_count, capacity, buffer_index,
                                    buffer_value);
    unsigned zeros = 0;
    // digit >= guess_bin <=> key >= guess_key (a key has no bits above the first digit's).
    const KeyOf<T> guess_key =
        partial ? static_cast<KeyOf<T>>(static_cast<u64>(guess_bin) << first.shift) : KeyOf<T>{};
    for_each_tile<T>(entries, d, [&](const TileItems<T>& items) {
        if (partial) {
            // Most entries lie below the guessed bin: one compare each, and the histogram and the
            // buffer only in a warp that holds an entry at or above it (as the general case
            // below does with a guess: zeros lie below it, the rest is counted and buffered).
            bool flag[kItems<T>];
            bool any = false;
#pragma unroll
            for (int j = 0; j < kItems<T>; ++j) {
                flag[j] = items.valid[j] && magnitude_key(items.value[j]) >= guess_key;
                any = any || flag[j];
            }
            if (!__any_sync(kFullWarp, any)) return;
#pragma unroll
            for (int j = 0; j < kItems<T>; ++j) {
                if (flag[j]) {
                    const u64 key = magnitude_key(items.value[j]);
                    atomicAdd(&shared_histogram[digit_of(first, key, 0)], 1u);
                }
            }
            appender.add(flag, items, entries);
            return;
        }
        // No guess, or bin 0 guessed: every entry is counted, and buffered if bin 0 was guessed.
        count_first_digit(items, first, shared_histogram, zeros);
        if (guess_bin == 0) appender.add(items.valid, items, entries);
    });
    appender.flush();
    end_first_digit(first, all_key_bits, state, histogram, capacity, shared_histogram,
                    shared_zeros, zeros);
}

// After a pass 1 whose guess was too high (state->redo_first): the first-digit histogram of
// every entry, read through `input` (pass 1 has already applied any update of its value
// source), zeros counted as in pass 1; the last block chooses the first digit's bin. Returns at
// once in every block otherwise.
template <typename T, typename Later>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm) first_retry_kernel(
        Later input, int64_t d, Level first, u64 all_key_bits, SelectState* state,
        u64* histogram, u64 capacity) {
    if (!state->redo_first) return;
    __shared__ unsigned shared_histogram[kMaxBins<T>];
    __shared__ unsigned shared_zeros;
    const int bins = 1 << first.bits;
    if (threadIdx.x == 0) shared_zeros = 0;
    clear_shared(shared_histogram, bins);
    const InputEntries<T, Later> entries{input};
    unsigned zeros = 0;
    for_each_tile<T>(entries, d, [&](const TileItems<T>& items) {
        count_first_digit(items, first, shared_histogram, zeros);
    });
    end_first_digit(first, all_key_bits, state, histogram, capacity, shared_histogram,
                    shared_zeros, zeros);
}

}  // namespace gtopk::cuda::detail
