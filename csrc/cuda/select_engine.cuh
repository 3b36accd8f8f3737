// The exact top-k selection engine behind every CUDA kernel of gtopk_hvd (used by topk_abs.cu
// and merge_topk.cu). Order and NaN rule: gtopk/magnitude_order.h.
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
//   overflow,
//   every entry that can still be selected is in the buffer and d is never read again: the
//   remaining digits are histogrammed over the buffer, O(n). Otherwise, the next pass over d
//   appends the entries at or above the prefix to the buffer as soon as they fit, while it
//   histograms the next digit. Heavy ties need more passes over d, one per key digit that does
//   not separate them, except exact zeros (counted in pass 1), which skip the key digits: an
//   all-zero input costs 3 passes.
//   Last: entries at or above the final prefix (exactly n) are staged (accumulate_select zeroes
//   residual[selected] in the same kernel), and sorted by index with cub::DeviceRadixSort into
//   the caller's output.
// Typical data: 1 read of d (plus the O(n) work); a wrong guess costs 1 more read.
//
// Launches per call, nothing else enqueued: init (zeroes the histograms, starts the state), the
// sample and the retry (guessing only), pass 1, one refine pass per later digit (a pass whose level has
// nothing to do returns at once), stage, and cub's sort. The last block of each histogram pass
// chooses the bin (arrive_last), so no one-block kernel runs between passes. Appends to the
// buffer and the staging area go through per-warp staging in shared memory (WarpAppender): no
// block-wide barrier per tile, and about one global atomic per 64 appended entries per warp.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_radix_sort.cuh>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "cuda_check.cuh"
#include "device.cuh"
#include "gtopk/cuda_ops.h"
#include "gtopk/magnitude_order.h"

namespace gtopk::cuda::detail {

using u64 = unsigned long long;  // the type CUDA's 64-bit atomics take

constexpr int kThreads = 256;
// Entries per thread per tile: 64 bytes of 4-byte values, 64 of 8-byte ones (register budget).
template <typename T> constexpr int kItems = sizeof(T) >= 8 ? 8 : 16;
constexpr int kMinBlocksPerSm = 3;  // register cap of the passes over d: 80 per thread
template <typename T> constexpr int64_t kTile = int64_t{kThreads} * kItems<T>;
constexpr int kDigitBits = 11;
constexpr int kMaxLevels = 16;
constexpr int64_t kSmallInput = int64_t{1} << 16;
constexpr int64_t kSampleSize = int64_t{1} << 16;
constexpr int64_t kGuessMaxFraction = 16;
constexpr int64_t kCapacitySlack = int64_t{1} << 16;

template <typename T> using KeyOf = typename MagnitudeTraits<T>::Key;

// Bits a key can use (all keys are below 2^kKeyBits) and the width of the first digit.
template <typename T> struct KeyLayout;
template <int KeyBits, int FirstDigit> struct KeyLayoutOf {
    static constexpr int kKeyBits = KeyBits, kFirstDigit = FirstDigit;
};
template <> struct KeyLayout<float> : KeyLayoutOf<31, 12> {};
template <> struct KeyLayout<double> : KeyLayoutOf<63, 13> {};
template <> struct KeyLayout<float16_bits> : KeyLayoutOf<15, 12> {};
template <> struct KeyLayout<bfloat16_bits> : KeyLayoutOf<15, 12> {};
template <typename T> constexpr int kMaxBins = 1 << KeyLayout<T>::kFirstDigit;

// ---------------------------------------------------------------------------------------------
// Host helpers

inline void require_index_fits(IndexType index_type, int64_t d) {
    if (index_type == IndexType::kInt32 && !int32_indices_fit(d)) {
        throw std::invalid_argument("gtopk: int32 indices cannot address more than " +
                                    std::to_string(kInt32IndexLimit) + " entries");
    }
}

// Calls body(T{}, Index{}) with the C++ types that the codes name; `what` names the caller in
// errors. 16-bit value types are accepted only With16Bit.
template <bool With16Bit, typename Body>
auto with_types(ValueType value_type, IndexType index_type, const char* what, Body&& body) {
    auto with_index = [&](auto value_tag) {
        switch (index_type) {
            case IndexType::kInt32: return body(value_tag, int32_t{});
            case IndexType::kInt64: return body(value_tag, int64_t{});
        }
        throw std::invalid_argument(std::string("gtopk::cuda::") + what +
                                    ": unsupported index type");
    };
    switch (value_type) {
        case ValueType::kFloat32: return with_index(float{});
        case ValueType::kFloat64: return with_index(double{});
        case ValueType::kFloat16:
            if constexpr (With16Bit) return with_index(float16_bits{});
            break;
        case ValueType::kBFloat16:
            if constexpr (With16Bit) return with_index(bfloat16_bits{});
            break;
    }
    throw std::invalid_argument(std::string("gtopk::cuda::") + what +
                                (With16Bit ? ": unsupported value type"
                                           : ": only float32 and float64 values are supported"));
}

inline int64_t blocks_for(int64_t count, int64_t per_block) {
    return std::max<int64_t>(1, (count + per_block - 1) / per_block);
}

// Grid of a tile-looping kernel: every SM full, never more blocks than tiles, and never more
// than 2^30 entries per block (its shared-memory counters are 32-bit).
template <typename T, typename Kernel>
int tile_grid(Kernel kernel, int64_t count) {
    const int device = current_device();
    const int sms = sm_count(device);
    const int per_sm = max_blocks_per_sm(reinterpret_cast<const void*>(kernel), kThreads, device);
    const int64_t resident = int64_t{std::max(sms, 1)} * std::max(per_sm, 1);
    const int64_t wanted = std::max(resident, blocks_for(count, int64_t{1} << 30));
    return static_cast<int>(std::min(wanted, blocks_for(count, kTile<T>)));
}

// ---------------------------------------------------------------------------------------------
// The digit schedule and the device state

struct Level {
    int on_key;  // digit of the key (1) or of the inverted index (0)
    int shift;
    int bits;
};

struct Schedule {
    Level level[kMaxLevels];
    int count;
};

template <typename T> Schedule make_schedule(int64_t d) {
    Schedule schedule{};
    auto add = [&schedule](int on_key, int top, int width) {
        schedule.level[schedule.count++] = Level{on_key, top - width, width};
    };
    int top = KeyLayout<T>::kKeyBits;
    add(1, top, KeyLayout<T>::kFirstDigit);
    top -= KeyLayout<T>::kFirstDigit;
    for (; top > 0; top -= std::min(top, kDigitBits)) add(1, top, std::min(top, kDigitBits));
    int index_bits = 0;
    while (index_bits < 63 && (static_cast<uint64_t>(d - 1) >> index_bits) != 0) ++index_bits;
    for (top = index_bits; top > 0; top -= std::min(top, kDigitBits)) {
        add(0, top, std::min(top, kDigitBits));
    }
    return schedule;
}

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

// +1: the entry comes before every entry matching the prefix, 0: it matches, -1: after.
__device__ __forceinline__ int locate(const SelectState& s, u64 key, u64 inv) {
    const u64 k = key & s.key_mask;
    if (k != s.key_prefix) return k > s.key_prefix ? 1 : -1;
    const u64 v = inv & s.inv_mask;
    if (v != s.inv_prefix) return v > s.inv_prefix ? 1 : -1;
    return 0;
}

// True when the prefix already fixes every bit of the level's digit.
__device__ __forceinline__ bool level_fixed(const SelectState& s, const Level& level) {
    const u64 mask = ((u64{1} << level.bits) - 1) << level.shift;
    return ((level.on_key ? s.key_mask : s.inv_mask) & mask) == mask;
}

__device__ __forceinline__ unsigned digit_of(const Level& level, u64 key, u64 inv) {
    const u64 v = level.on_key ? key : inv;
    return static_cast<unsigned>((v >> level.shift) & ((u64{1} << level.bits) - 1));
}

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

// ---------------------------------------------------------------------------------------------
// Block-level building blocks

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

// ---------------------------------------------------------------------------------------------
// Kernels
//
// A pass whose blocks all add to one histogram ends in its last block, which acts on the total
// (guesses the first bin, chooses the bin of a level): each block, once its writes are done,
// fences them and counts itself in state->arrivals; the block that counts last resets the count
// and reads the others' results through L2. This saves a one-block kernel launch per level.

// True in every thread of the block that arrives last. Call with every thread, after the
// block's writes to global memory.
__device__ __forceinline__ bool arrive_last(unsigned* arrivals) {
    __shared__ bool is_last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        is_last = atomicAdd(arrivals, 1u) == gridDim.x - 1;
        if (is_last) __threadfence();
    }
    __syncthreads();
    return is_last;
}

// The state as the other blocks of this kernel left it (read through L2).
__device__ __forceinline__ SelectState load_state(const SelectState* state) {
    static_assert(sizeof(SelectState) % sizeof(u64) == 0 && alignof(SelectState) == alignof(u64),
                  "SelectState is read as 64-bit words");
    constexpr int kWords = sizeof(SelectState) / sizeof(u64);
    u64 words[kWords];
    const u64* from = reinterpret_cast<const u64*>(state);
#pragma unroll
    for (int w = 0; w < kWords; ++w) words[w] = __ldcg(from + w);
    SelectState s;
    memcpy(&s, words, sizeof(s));
    return s;
}

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
            const u64 bin_mask = ((u64{1} << level.bits) - 1) << level.shift;
            const u64 bin_bits = static_cast<u64>(c.bin) << level.shift;
            if (level.on_key) {
                s.key_prefix |= bin_bits;
                s.key_mask |= bin_mask;
            } else {
                s.inv_prefix |= bin_bits;
                s.inv_mask |= bin_mask;
            }
            if (is_first && c.bin == 0 && c.in_bin == s.zero_count) s.key_mask = all_key_bits;
            s.rank -= c.above;
            s.done = s.rank == c.in_bin;
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
        bool flag[kItems<T>];
        if (partial) {
            // Most entries lie below the guessed bin: one compare each, and the histogram and the
            // buffer only in a warp that holds an entry at or above it (as the general case
            // below does with a guess: zeros lie below it, the rest is counted and buffered).
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
#pragma unroll
        for (int j = 0; j < kItems<T>; ++j) {
            const u64 key = magnitude_key(items.value[j]);
            if (items.valid[j]) {
                if (key == 0) {
                    ++zeros;
                } else {
                    atomicAdd(&shared_histogram[digit_of(first, key, 0)], 1u);
                }
            }
            flag[j] = items.valid[j];
        }
        if (guess_bin == 0) appender.add(flag, items, entries);
    });
    appender.flush();
    if (zeros != 0) {
        atomicAdd(&shared_histogram[0], zeros);
        atomicAdd(&shared_zeros, zeros);
    }
    flush_shared(shared_histogram, bins, histogram);
    if (threadIdx.x == 0 && shared_zeros != 0) atomicAdd(&state->zero_count, u64{shared_zeros});
    if (arrive_last(&state->arrivals)) {
        choose_bin(first, true, all_key_bits, histogram, state, capacity);
    }
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
#pragma unroll
        for (int j = 0; j < kItems<T>; ++j) {
            if (!items.valid[j]) continue;
            const u64 key = magnitude_key(items.value[j]);
            if (key == 0) {
                ++zeros;
            } else {
                atomicAdd(&shared_histogram[digit_of(first, key, 0)], 1u);
            }
        }
    });
    if (zeros != 0) {
        atomicAdd(&shared_histogram[0], zeros);
        atomicAdd(&shared_zeros, zeros);
    }
    flush_shared(shared_histogram, bins, histogram);
    if (threadIdx.x == 0 && shared_zeros != 0) atomicAdd(&state->zero_count, u64{shared_zeros});
    if (arrive_last(&state->arrivals)) {
        choose_bin(first, true, all_key_bits, histogram, state, capacity);
    }
}

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

// ---------------------------------------------------------------------------------------------
// Host driver

template <typename T> using BitsOf = KeyOf<T>;  // unsigned integer of T's width
template <typename Index> using UnsignedOf = std::make_unsigned_t<Index>;

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

    void lay_out() {
        Layout layout;
        at_state = layout.add<SelectState>(1);
        at_histogram = layout.add<u64>(kMaxBins<T>);
        at_sample_histogram = layout.add<u64>(kMaxBins<T>);
        at_buffer_index = layout.add<Index>(capacity);
        at_buffer_value = layout.add<T>(capacity);
        at_stage_index = layout.add<Index>(n);
        at_stage_value = layout.add<T>(n);
        at_sort = layout.add<char>(static_cast<int64_t>(sort_bytes));
        bytes = layout.bytes();
    }
};

template <typename T, typename Index> SelectPlan<T, Index> plan_select(int64_t d, int64_t n) {
    SelectPlan<T, Index> plan{};
    plan.d = d;
    plan.n = n;
    const bool guessable = n * kGuessMaxFraction <= d && d > kSmallInput;
    plan.samples = std::min(kSampleSize, d);
    plan.stride = d / plan.samples;
    const double expected = static_cast<double>(n) * plan.samples / d;
    plan.sample_rank =
        1 + static_cast<int64_t>(std::ceil(expected + 4.0 * std::sqrt(expected) + 4.0));
    plan.guess = guessable && plan.sample_rank <= plan.samples;
    plan.capacity = std::min(
        d, std::max(2 * n, plan.guess ? 2 * plan.sample_rank * plan.stride : 0) + kCapacitySlack);

    const u64 last = static_cast<u64>(d - 1);
    plan.end_bit = 1;
    while (plan.end_bit < 64 && (last >> plan.end_bit) != 0) ++plan.end_bit;
    using UIndex = UnsignedOf<Index>;
    using Bits = BitsOf<T>;
    check_cuda(cub::DeviceRadixSort::SortPairs(
                   nullptr, plan.sort_bytes, static_cast<const UIndex*>(nullptr),
                   static_cast<UIndex*>(nullptr), static_cast<const Bits*>(nullptr),
                   static_cast<Bits*>(nullptr), n, 0, plan.end_bit),
               "cub::DeviceRadixSort::SortPairs (size query)", __FILE__, __LINE__);
    plan.lay_out();
    return plan;
}

// Workspace bytes enough for select_topk over any d' <= d values with any n' <= n: the plan for
// (d, n) with the buffer at the largest capacity any plan can have, d.
template <typename T, typename Index> size_t select_bytes_bound(int64_t d, int64_t n) {
    SelectPlan<T, Index> plan = plan_select<T, Index>(d, n);
    plan.capacity = d;
    plan.lay_out();
    return plan.bytes;
}

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
                      const int32_t* skip = nullptr, AfterSample after_sample = {}) {
    if (workspace.bytes < plan.bytes) {
        throw std::logic_error("gtopk: select_topk was given a workspace of " +
                               std::to_string(workspace.bytes) + " bytes, it needs " +
                               std::to_string(plan.bytes));
    }
    const int64_t d = plan.d, n = plan.n, capacity = plan.capacity;
    const int64_t samples = plan.samples, stride = plan.stride, sample_rank = plan.sample_rank;
    const bool guess = plan.guess;
    const Schedule schedule = make_schedule<T>(d);
    const u64 last = static_cast<u64>(d - 1);
    using UIndex = UnsignedOf<Index>;
    using Bits = BitsOf<T>;

    SelectState* state = piece<SelectState>(workspace, plan.at_state);
    u64* histogram = piece<u64>(workspace, plan.at_histogram);
    u64* sample_histogram = piece<u64>(workspace, plan.at_sample_histogram);
    Index* buffer_index = piece<Index>(workspace, plan.at_buffer_index);
    T* buffer_value = piece<T>(workspace, plan.at_buffer_value);
    Index* stage_index = piece<Index>(workspace, plan.at_stage_index);
    T* stage_value = piece<T>(workspace, plan.at_stage_value);

    init_kernel<T><<<1, kThreads, 0, stream>>>(state, static_cast<u64>(n), histogram,
                                               sample_histogram);
    GTOPK_CUDA_CHECK_LAUNCH("init_kernel");

    const Level first = schedule.level[0];
    if (guess) {
        // One sample per thread: the strided loads are all in flight at once.
        const int sample_blocks = static_cast<int>(blocks_for(samples, kThreads));
        sample_guess_kernel<T, Values><<<sample_blocks, kThreads, 0, stream>>>(
            values, stride, samples, first, sample_histogram, static_cast<u64>(sample_rank),
            static_cast<u64>(capacity), state);
        GTOPK_CUDA_CHECK_LAUNCH("sample_guess_kernel");
    }
    after_sample(state, first, stream);

    const u64 all_key_bits = (u64{1} << KeyLayout<T>::kKeyBits) - 1;
    const auto first_kernel = first_pass_kernel<T, Index, Values>;
    first_kernel<<<tile_grid<T>(first_kernel, d), kThreads, 0, stream>>>(
        values, d, first, all_key_bits, state, histogram, buffer_index, buffer_value,
        static_cast<u64>(capacity));
    GTOPK_CUDA_CHECK_LAUNCH("first_pass_kernel");
    if (guess) {
        const auto retry_kernel = first_retry_kernel<T, Later>;
        retry_kernel<<<tile_grid<T>(retry_kernel, d), kThreads, 0, stream>>>(
            input, d, first, all_key_bits, state, histogram, static_cast<u64>(capacity));
        GTOPK_CUDA_CHECK_LAUNCH("first_retry_kernel");
    }

    const auto refine_kernel = refine_pass_kernel<T, Index, Later>;
    const int refine_grid = tile_grid<T>(refine_kernel, d);
    for (int l = 1; l < schedule.count; ++l) {
        refine_kernel<<<refine_grid, kThreads, 0, stream>>>(
            input, d, schedule.level[l], last, all_key_bits, state, histogram, buffer_index,
            buffer_value, static_cast<u64>(capacity));
        GTOPK_CUDA_CHECK_LAUNCH("refine_pass_kernel");
    }

    const auto stage_kernel = stage_selected_kernel<T, Index, Later>;
    stage_kernel<<<tile_grid<T>(stage_kernel, d), kThreads, 0, stream>>>(
        input, d, last, state, buffer_index, buffer_value, static_cast<u64>(capacity),
        stage_index, stage_value, residual_to_zero, skip);
    GTOPK_CUDA_CHECK_LAUNCH("stage_selected_kernel");

    size_t sort_bytes = plan.sort_bytes;
    check_cuda(cub::DeviceRadixSort::SortPairs(
                   piece<char>(workspace, plan.at_sort), sort_bytes,
                   reinterpret_cast<const UIndex*>(stage_index),
                   reinterpret_cast<UIndex*>(out_index), reinterpret_cast<const Bits*>(stage_value),
                   reinterpret_cast<Bits*>(out_value), n, 0, plan.end_bit, stream),
               "cub::DeviceRadixSort::SortPairs", __FILE__, __LINE__);
}

// select_topk_from with later passes reading the array `input`.
template <typename T, typename Index, typename Values>
void select_topk(const SelectPlan<T, Index>& plan, Values values, const T* input,
                 Index* out_index, T* out_value, T* residual_to_zero, const Workspace& workspace,
                 cudaStream_t stream, const int32_t* skip = nullptr) {
    select_topk_from<T, Index>(plan, values, ReadValues<T>{input}, out_index, out_value,
                               residual_to_zero, workspace, stream, skip);
}

}  // namespace gtopk::cuda::detail
