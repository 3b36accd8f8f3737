// The contract of the exact top-k selection engine behind the CUDA kernels of gtopk_hvd
// (topk_abs.cu, merge_topk.cu, count_sketch.cu; segmented_select.cu runs the same digit rules
// over many segments): what a kernel file may rely on. Order and NaN rule:
// gtopk/magnitude_order.h. Defined in csrc/cuda/select/: dispatch/ (host side: type dispatch,
// the plan, the launcher) and agent/ (device side: warp and block primitives, the kernels); a
// kernel file includes select/dispatch/launch.cuh, which includes this header.
//
// Entries are ranked by the composite (magnitude key, inverted index), inverted index =
// (d - 1) - index, so that every entry has a distinct rank and "larger composite" means "comes
// first". The engine radix-selects the n-th largest composite, digit by digit from the top
// (first digit 12 or 13 bits of the key, then 11-bit digits of the key, then of the inverted
// index), keeping on the device a prefix, the rank still wanted inside it, and a done flag: once
// every entry matching the prefix is wanted, the selection is "every entry at or above the
// prefix" and the remaining digits are skipped. All decisions stay on the device, so nothing
// synchronises; the host enqueues a fixed sequence of kernels that return at once when the
// device state says they have nothing to do.
//
// Passes over the d input values, for n = min(k, d) with 0 < n < d:
//   0. (n <= d/16, d > 2^16) sample 2^16 strided keys, and from their first-digit histogram
//      guess a first-digit bin g a little below the n-th largest key.
//   1. Pass 1 over d: first-digit histogram (shared memory per block) of the entries with first
//      digit >= g (of every entry without a guess), and append those entries to a candidate
//      buffer of capacity ~2n (one global atomic per tile of 256 x 16 entries).
//      accumulate_select's residual += gradient is fused into this pass.
//   The first digit's bin b is chosen on the device. If the bins >= g hold fewer than n entries
//   (the guess was too high), one more pass over d histograms every entry's first digit (the
//   retry pass, launched always, returns at once otherwise). If b >= g and the buffer did not
//   overflow, every entry that can still be selected is in the buffer and d is never read
//   again: the remaining digits are histogrammed over the buffer, O(n). Otherwise, the next
//   pass over d appends the entries at or above the prefix to the buffer as soon as they fit,
//   while it histograms the next digit. Heavy ties need more passes over d, one per key digit
//   that does not separate them, except exact zeros (counted in pass 1), which skip the key
//   digits: an all-zero input costs 3 passes.
//   Last: entries at or above the final prefix (exactly n) are staged (accumulate_select zeroes
//   residual[selected] in the same kernel), and sorted by index with cub::DeviceRadixSort into
//   the caller's output.
// Typical data: 1 read of d (plus the O(n) work); a wrong guess costs 1 more read.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "gtopk/cuda_ops.h"
#include "gtopk/magnitude_order.h"

namespace gtopk::cuda::detail {

using u64 = unsigned long long;  // the type CUDA's 64-bit atomics take

// ---------------------------------------------------------------------------------------------
// The digit schedule and the device state
//
// A level is one digit of the composite: `bits` bits from bit `shift` up, of the key (on_key) or
// of the inverted index. The schedule (select/dispatch/plan.cuh) is the first digit of the key,
// then its later digits, then the digits of the inverted index down to bit 0. The state lives in
// the workspace; only the engine's kernels write it, and the host never reads it.

struct Level {
    int on_key;  // digit of the key (1) or of the inverted index (0)
    int shift;
    int bits;
};

enum Source : int { kFromInput = 0, kFromBuffer = 1 };

struct SelectState {
    u64 key_prefix, key_mask;  // key bits fixed so far
    u64 inv_prefix, inv_mask;  // inverted-index bits fixed so far
    u64 wanted;                // n
    u64 rank;                  // entries still wanted among those matching the prefix
    u64 buffer_count;          // entries appended to the buffer (may exceed its capacity)
    u64 staged_count;          // entries appended to the staging area
    u64 zero_count;            // entries with key 0 (pass 1)
    int source;                // where every entry at or above the prefix can be found
    int collect;               // the next pass over the input fills the buffer
    int done;                  // every entry matching the prefix is wanted
    int guess_bin;             // pass 1 buffers first digits >= guess_bin; -1: no guess
    int redo_first;            // the guess was wrong: the first digit is histogrammed again
    unsigned arrivals;         // blocks of the running pass that have finished (arrive_last)
};

// ---------------------------------------------------------------------------------------------
// Value sources
//
// A value source gives pass 1 and the sample the values they select from:
//   load(i)     the value pass 1 sees at entry i; no side effect (for_each_tile loads a whole
//               tile before any entry is written back)
//   keep(i, v)  writes back what reading entry i changes, v being load(i): called by
//               for_each_tile after every load of the tile was issued (AccumulateValues'
//               residual[i] = v). A store placed between two loads that may alias it (the
//               gradient and the residual are separate pointers to the compiler) would hold
//               each later load behind the earlier load's round trip to memory: a tile's loads
//               would run one after another instead of together.
//   peek(i)     the value of entry i as it stands after pass 1 would have read it (the sample
//               reads it before pass 1); no side effect
// Later passes read through a source whose keep does nothing.

template <typename T> struct ReadValues {
    const T* x;
    __device__ T load(int64_t i) const { return x[i]; }
    __device__ void keep(int64_t, T) const {}
    __device__ T peek(int64_t i) const { return x[i]; }
};

// residual += gradient as pass 1 reads it. skip: null, or an int32 in device memory; when it
// is nonzero (read once per kernel, `on_device`), the residual is read as it is and nothing is
// written: the selection is then the residual's own top-k, and the state stays as it was.
template <typename T> struct AccumulateValues {
    const T* gradient;
    T* residual;
    const int32_t* skip = nullptr;
    bool skipping = false;
    __device__ T load(int64_t i) const { return peek(i); }
    __device__ void keep(int64_t i, T v) const {
        if (!skipping) residual[i] = v;
    }
    __device__ T peek(int64_t i) const {
        return skipping ? residual[i] : residual[i] + gradient[i];
    }
};

// Whether the device flag `skip` (null: none) is set.
__device__ __forceinline__ bool flag_set(const int32_t* skip) {
    return skip != nullptr && *skip != 0;
}

// A value source as a kernel uses it: AccumulateValues reads its skip flag here, once.
template <typename Values> __device__ __forceinline__ Values on_device(Values values) {
    return values;
}
template <typename T>
__device__ __forceinline__ AccumulateValues<T> on_device(AccumulateValues<T> values) {
    values.skipping = flag_set(values.skip);
    return values;
}

// ---------------------------------------------------------------------------------------------
// The plan and the entry points

// What select_topk decides on the host for d values and n = min(k, d) outputs, 0 < n < d, and
// where its scratch lies in the workspace.
template <typename T, typename Index> struct SelectPlan {
    int64_t d, n;
    bool guess;
    int64_t samples, stride, sample_rank, capacity;
    int end_bit;  // bits of d - 1, the largest index: the sort's key width
    size_t sort_bytes;
    size_t at_state, at_histogram, at_sample_histogram, at_buffer_index, at_buffer_value,
        at_stage_index, at_stage_value, at_sort, bytes;

    // Lays out the scratch pieces (at_*) and their total, bytes, for the fields above.
    void lay_out();
};

// The plan of top-n over d values (0 < n < d): the guess, the buffer's capacity, the sort's key
// width and the workspace layout. Queries cub for its sort's scratch (no work enqueued).
template <typename T, typename Index> SelectPlan<T, Index> plan_select(int64_t d, int64_t n);

// Workspace bytes enough for select_topk over any d' <= d values with any n' <= n: the plan for
// (d, n) with the buffer at the largest capacity any plan can have, d.
template <typename T, typename Index> size_t select_bytes_bound(int64_t d, int64_t n);

// Nothing enqueued between the sample and pass 1.
struct NoHook {
    void operator()(const SelectState*, const Level&, cudaStream_t) const {}
};

// Top-n of the d values into (out_index, out_value), sorted by index, as planned by
// plan_select(d, n), in a workspace of at least plan.bytes.
// The sample and pass 1 read through `values` (which may update the input as it reads: pass 1
// loads each entry once and keeps it, the sample peeks); later passes over d read through
// `input`, a value source without side effects (ReadValues of an array, or values computed on
// the fly, e.g. the count sketch's estimates). If residual_to_zero is set,
// residual_to_zero[selected] = 0 afterwards, unless the device flag `skip` (null: none) is set.
// after_sample(state, first level, stream) enqueues work between the sample (state->guess_bin
// set on the device) and pass 1. With a guess g > 0, pass 1 looks only at entries whose first
// digit is >= g: `values.load` may return 0 for any entry it knows to lie below that bin (the
// count sketch's row bitmaps), and the selection is unchanged.
template <typename T, typename Index, typename Values, typename Later,
          typename AfterSample = NoHook>
void select_topk_from(const SelectPlan<T, Index>& plan, Values values, Later input,
                      Index* out_index, T* out_value, T* residual_to_zero,
                      const Workspace& workspace, cudaStream_t stream,
                      const int32_t* skip = nullptr, AfterSample after_sample = {});

// select_topk_from with later passes reading the array `input`.
template <typename T, typename Index, typename Values>
void select_topk(const SelectPlan<T, Index>& plan, Values values, const T* input,
                 Index* out_index, T* out_value, T* residual_to_zero, const Workspace& workspace,
                 cudaStream_t stream, const int32_t* skip = nullptr);

}  // namespace gtopk::cuda::detail
