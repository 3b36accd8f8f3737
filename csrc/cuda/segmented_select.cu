// gtopk::cuda::segmented_accumulate_select: accumulate_select over every segment of a vector,
// each with its own k, in one fixed sequence of launches for all the segments (not one
// sequence per segment).
//
// The radix select of gtopk/select_engine.cuh (composite (magnitude key, inverted index) ranks,
// the same digit schedule, the same device-side state and bin choice), with one state and one
// histogram per segment, and passes over d that give each block one chunk of kSegmentChunk
// entries of one segment (gtopk/segments.h; a block finds its segment by a binary search of the
// chunk offsets). Inverted indices are local to the segment, (len_s - 1) - (i - offsets[s]),
// so every segment selects exactly what accumulate_select selects on it alone.
//   1. pass over d: residual += gradient (gradient = 0 if asked), first-digit histogram of
//      each segment (shared-memory counters per block, added to the segment's row);
//   2. choose (one block per segment): the bin of the segment's n_s-th largest entry;
//   3. for each further digit: a pass over the segments still undecided (a block whose
//      segment is decided, or wants nothing, returns at once) histograms the digit over the
//      entries matching the segment's prefix, then choose again;
//   4. stage: one pass appends each segment's selected entries (exactly n_s) at its output
//      offset, with global indices, and zeroes the residual there;
//   5. one cub::DeviceRadixSort of the staged entries by index: segments occupy increasing
//      index ranges, so this sorts each segment by index and keeps the segment order.
// Typical data: the accumulating pass, then two or three reads of d (digits 2 and 3 of the key,
// the stage), whatever the number of segments; no candidate buffer. Segments are taken in
// batches of at most kBatchSegments (the per-segment histograms are the scratch that grows with
// the segment count), each batch one launch sequence.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda_check.cuh"
#include "gtopk/cuda_ops.h"
#include "gtopk/segments.h"
#include "select/agent/block_histogram.cuh"
#include "select/agent/digits.cuh"
#include "select/agent/tiles.cuh"
#include "select/dispatch/grid.cuh"
#include "select/dispatch/plan.cuh"
#include "select/dispatch/types.cuh"
#include "select/tuning.cuh"

namespace gtopk::cuda {
namespace {

using detail::check_cuda;
using detail::BinChoice;
using detail::blocks_for;
using detail::clear_shared;
using detail::digit_of;
using detail::find_bin;
using detail::KeyLayout;
using detail::kItems;
using detail::kMaxBins;
using detail::kMinBlocksPerSm;
using detail::kThreads;
using detail::kTile;
using detail::Layout;
using detail::level_fixed;
using detail::Level;
using detail::locate;
using detail::piece;
using detail::Schedule;
using detail::SelectState;
using detail::TileItems;
using detail::u64;

constexpr int64_t kBatchSegments = 256;

// Appends the flagged items of a tile at out[counter...]: one global atomic per tile; slots at
// or past capacity are counted but not written. Call with every thread of the block.
template <typename T, typename Entries, typename Index>
__device__ void append_flagged(const bool (&flag)[kItems<T>], const TileItems<T>& items,
                               const Entries& entries, u64* counter, u64 capacity,
                               Index* out_index, T* out_value) {
    using BlockScan = cub::BlockScan<unsigned, kThreads>;
    __shared__ typename BlockScan::TempStorage scan_storage;
    __shared__ u64 tile_base;
    unsigned count = 0;
#pragma unroll
    for (int j = 0; j < kItems<T>; ++j) count += flag[j] ? 1u : 0u;
    if (!__syncthreads_or(count != 0)) return;
    unsigned offset = 0, total = 0;
    BlockScan(scan_storage).ExclusiveSum(count, offset, total);
    if (threadIdx.x == 0) tile_base = atomicAdd(counter, static_cast<u64>(total));
    __syncthreads();
    u64 slot = tile_base + offset;
#pragma unroll
    for (int j = 0; j < kItems<T>; ++j) {
        if (flag[j]) {
            if (slot < capacity) {
                out_index[slot] = static_cast<Index>(entries.index(items.position(j)));
                out_value[slot] = items.value[j];
            }
            ++slot;
        }
    }
}


// The table's rows for the segments of one batch, [first, first + count) of the table.
struct Segments {
    const int64_t* offsets;        // count + 1 entries
    const int64_t* out_offsets;    // count + 1 entries
    const int64_t* chunk_offsets;  // count + 1 entries
    int64_t count;
};

// This block's chunk: its segment, and the range [begin, end) of the vector it covers.
struct Chunk {
    int64_t segment, begin, end, segment_begin, segment_length;
};

__device__ Chunk my_chunk(const Segments& segments) {
    __shared__ Chunk chunk;
    if (threadIdx.x == 0) {
        const int64_t c = segments.chunk_offsets[0] + blockIdx.x;
        // The last segment s with chunk_offsets[s] <= c (empty segments own no chunk).
        int64_t lo = 0, hi = segments.count - 1;
        while (lo < hi) {
            const int64_t mid = (lo + hi + 1) / 2;
            if (segments.chunk_offsets[mid] <= c) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        const int64_t begin = segments.offsets[lo], end = segments.offsets[lo + 1];
        const int64_t chunk_begin = begin + (c - segments.chunk_offsets[lo]) * kSegmentChunk;
        const int64_t chunk_end = chunk_begin + kSegmentChunk < end ? chunk_begin + kSegmentChunk
                                                                    : end;
        chunk = Chunk{lo, chunk_begin, chunk_end, begin, end - begin};
    }
    __syncthreads();
    return chunk;
}

// Writes nothing back: the keep of a pass that only reads.
struct KeepNothing {
    template <typename T> __device__ void operator()(int64_t, T) const {}
};

// A chunk's entries as visit_tile (select/agent/tiles.cuh) reads them: value(i) = load(i), with
// no side effect; keep(i, v) writes back what reading entry i changed.
template <typename T, typename Load, typename Keep> struct ChunkEntries {
    Load& read;
    Keep& write_back;
    __device__ T value(int64_t i) const { return read(i); }
    __device__ void keep(int64_t i, T v) const { write_back(i, v); }
};

// Calls visit(items) for each tile of the chunk [begin, end): visit_tile (select/agent/tiles.cuh:
// every load of a tile issued before keep writes any back, and a full tile visited without bound
// checks), over the chunk instead of the block's share of every tile. Every thread of the
// block makes the same calls, so visit may synchronise.
template <typename T, typename Load, typename Keep, typename Visit>
__device__ __forceinline__ void for_each_chunk_tile(int64_t begin, int64_t end, Load&& load,
                                                    Keep&& keep, Visit&& visit) {
    const ChunkEntries<T, std::remove_reference_t<Load>, std::remove_reference_t<Keep>> entries{
        load, keep};
    for (int64_t start = begin; start < end; start += kTile<T>) {
        const int64_t first = start + threadIdx.x;
        if (start + kTile<T> <= end) {
            detail::visit_tile<true, T>(entries, end, first, visit);
        } else {
            detail::visit_tile<false, T>(entries, end, first, visit);
        }
    }
}

// The entries as append_flagged reads them: global indices.
template <typename T> struct GlobalEntries {
    __device__ u64 index(int64_t i) const { return static_cast<u64>(i); }
};

__device__ __forceinline__ void flush_row(const unsigned* shared_histogram, int bins,
                                          u64* row) {
    __syncthreads();
    for (int b = threadIdx.x; b < bins; b += blockDim.x) {
        if (shared_histogram[b] != 0) atomicAdd(&row[b], static_cast<u64>(shared_histogram[b]));
    }
}

__global__ void init_states_kernel(Segments segments, SelectState* states) {
    const int64_t s = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
    if (s >= segments.count) return;
    SelectState state{};
    state.wanted = static_cast<u64>(segments.out_offsets[s + 1] - segments.out_offsets[s]);
    state.rank = state.wanted;
    state.guess_bin = -1;
    states[s] = state;
}

// Pass 1: residual += gradient (gradient = 0 if clear; no accumulation when gradient is null or
// the skip flag is set) and the first-digit histogram of the segments that want entries. Zero
// keys are counted in registers (sparse inputs would otherwise serialise on one shared counter).
template <typename T>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm) segmented_first_pass_kernel(
        T* gradient, T* residual, bool clear_gradient, Segments segments, Level first,
        const SelectState* states, u64* histogram, const int32_t* skip) {
    const bool skipping = detail::flag_set(skip);
    __shared__ unsigned shared_histogram[kMaxBins<T>];
    const Chunk chunk = my_chunk(segments);
    const bool counted = states[chunk.segment].wanted != 0;
    const int bins = 1 << first.bits;
    if (counted) clear_shared(shared_histogram, bins);
    unsigned zeros = 0;
    const bool accumulate = gradient != nullptr && !skipping;
    auto load = [&](int64_t i) { return accumulate ? residual[i] + gradient[i] : residual[i]; };
    auto keep = [&](int64_t i, T v) {
        if (accumulate) residual[i] = v;
        if (gradient != nullptr && clear_gradient) gradient[i] = T(0);
    };
    for_each_chunk_tile<T>(chunk.begin, chunk.end, load, keep, [&](const TileItems<T>& items) {
        if (counted) count_first_digit(items, first, shared_histogram, zeros);
    });
    if (!counted) return;
    if (zeros != 0) atomicAdd(&shared_histogram[0], zeros);
    flush_row(shared_histogram, bins, histogram + chunk.segment * int64_t{kMaxBins<T>});
}

// Whether a segment takes part in the level: it wants entries, is undecided, and the prefix
// does not fix the level's digit yet. The pass and the choice that follows it agree on it.
__device__ __forceinline__ bool level_wanted(const SelectState& s, const Level& level) {
    return s.wanted != 0 && !s.done && !level_fixed(s, level);
}

// Passes 2..: histogram of the level's digit over the entries matching the segment's prefix.
template <typename T>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm) segmented_refine_kernel(
        const T* residual, Segments segments, Level level, const SelectState* states,
        u64* histogram) {
    __shared__ unsigned shared_histogram[kMaxBins<T>];
    const Chunk chunk = my_chunk(segments);
    const SelectState s = states[chunk.segment];
    if (!level_wanted(s, level)) return;
    const int bins = 1 << level.bits;
    clear_shared(shared_histogram, bins);
    const u64 last = static_cast<u64>(chunk.segment_length - 1);
    const u64 base = static_cast<u64>(chunk.segment_begin);
    auto load = [&](int64_t i) { return residual[i]; };
    for_each_chunk_tile<T>(chunk.begin, chunk.end, load, KeepNothing{},
                           [&](const TileItems<T>& items) {
#pragma unroll
        for (int j = 0; j < kItems<T>; ++j) {
            if (!items.valid[j]) continue;
            const u64 key = magnitude_key(items.value[j]);
            const u64 inv = last - (static_cast<u64>(items.position(j)) - base);
            if (locate(s, key, inv) == 0) {
                atomicAdd(&shared_histogram[digit_of(level, key, inv)], 1u);
            }
        }
    });
    flush_row(shared_histogram, bins, histogram + chunk.segment * int64_t{kMaxBins<T>});
}

// One block per segment: narrows the segment's prefix to the bin of its wanted rank and clears
// the histogram row it used.
template <typename T>
__global__ void __launch_bounds__(kThreads) segmented_choose_kernel(Level level,
                                                                     SelectState* states,
                                                                     u64* histogram) {
    __shared__ SelectState s;
    if (threadIdx.x == 0) s = states[blockIdx.x];
    __syncthreads();
    if (!level_wanted(s, level)) return;
    u64* row = histogram + blockIdx.x * int64_t{kMaxBins<T>};
    const int bins = 1 << level.bits;
    const BinChoice c = find_bin(row, bins, s.rank);
    if (threadIdx.x == 0 && c.bin >= 0) {
        narrow_to_bin(s, level, c);
        states[blockIdx.x] = s;
    }
    __syncthreads();
    for (int b = threadIdx.x; b < bins; b += blockDim.x) row[b] = 0;
}

// The selected entries of each segment (at or above its final prefix: exactly n_s) go to the
// staging area at the segment's output offset, with global indices; the residual is zeroed
// there (unless the skip flag is set).
template <typename T, typename Index>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm) segmented_stage_kernel(
        T* residual, Segments segments, SelectState* states, Index* stage_index,
        T* stage_value, const int32_t* skip) {
    const bool skipping = detail::flag_set(skip);
    const Chunk chunk = my_chunk(segments);
    const SelectState s = states[chunk.segment];
    if (s.wanted == 0) return;
    const int64_t out = segments.out_offsets[chunk.segment] - segments.out_offsets[0];
    const u64 last = static_cast<u64>(chunk.segment_length - 1);
    const u64 base = static_cast<u64>(chunk.segment_begin);
    u64* staged = &states[chunk.segment].staged_count;
    auto load = [&](int64_t i) { return residual[i]; };
    for_each_chunk_tile<T>(chunk.begin, chunk.end, load, KeepNothing{},
                           [&](const TileItems<T>& items) {
        bool selected[kItems<T>];
#pragma unroll
        for (int j = 0; j < kItems<T>; ++j) {
            selected[j] = false;
            if (!items.valid[j]) continue;
            const u64 inv = last - (static_cast<u64>(items.position(j)) - base);
            selected[j] = locate(s, magnitude_key(items.value[j]), inv) >= 0;
        }
        append_flagged(selected, items, GlobalEntries<T>{}, staged, s.wanted, stage_index + out,
                       stage_value + out);
#pragma unroll
        for (int j = 0; j < kItems<T>; ++j) {
            if (selected[j] && !skipping) residual[items.position(j)] = T{};
        }
    });
}

// ---------------------------------------------------------------------------------------------
// Host side

template <typename T> using BitsOf = detail::KeyOf<T>;
template <typename Index> using UnsignedOf = std::make_unsigned_t<Index>;

// One batch of segments [first, first + count) of the table, and where its scratch lies.
struct Batch {
    int64_t first, count, chunks, selected, max_length;
    int end_bit;  // bits of the batch's largest index: the sort's key width
};

// The host copy of the table's three rows.
struct HostTable {
    const int64_t* offsets;
    const int64_t* out_offsets;
    const int64_t* chunk_offsets;
};

HostTable host_rows(const int64_t* table, int64_t segments) {
    return {table, table + (segments + 1), table + 2 * (segments + 1)};
}

Batch batch_at(const HostTable& rows, int64_t first, int64_t segments) {
    Batch batch{};
    batch.first = first;
    batch.count = std::min(kBatchSegments, segments - first);
    const int64_t end = first + batch.count;
    batch.chunks = rows.chunk_offsets[end] - rows.chunk_offsets[first];
    batch.selected = rows.out_offsets[end] - rows.out_offsets[first];
    for (int64_t s = first; s < end; ++s) {
        batch.max_length = std::max(batch.max_length, rows.offsets[s + 1] - rows.offsets[s]);
    }
    const u64 last = static_cast<u64>(std::max<int64_t>(rows.offsets[end] - 1, 0));
    batch.end_bit = 1;
    while (batch.end_bit < 64 && (last >> batch.end_bit) != 0) ++batch.end_bit;
    return batch;
}

// Scratch of every batch, laid out alike: states and histogram rows of kBatchSegments segments,
// the staging area and the sort's scratch of the largest batch.
template <typename T, typename Index> struct SegmentedPlan {
    size_t at_states, at_histogram, at_stage_index, at_stage_value, at_sort, sort_bytes, bytes;
};

template <typename T, typename Index>
SegmentedPlan<T, Index> plan_segmented(const HostTable& rows, int64_t segments) {
    int64_t largest = 0, count = 0;
    for (int64_t first = 0; first < segments; first += kBatchSegments) {
        const Batch batch = batch_at(rows, first, segments);
        largest = std::max(largest, batch.selected);
        count = std::max(count, batch.count);
    }
    SegmentedPlan<T, Index> plan{};
    using UIndex = UnsignedOf<Index>;
    using Bits = BitsOf<T>;
    check_cuda(cub::DeviceRadixSort::SortPairs(
                   nullptr, plan.sort_bytes, static_cast<const UIndex*>(nullptr),
                   static_cast<UIndex*>(nullptr), static_cast<const Bits*>(nullptr),
                   static_cast<Bits*>(nullptr), std::max<int64_t>(largest, 1), 0,
                   static_cast<int>(8 * sizeof(UIndex))),
               "cub::DeviceRadixSort::SortPairs (size query)", __FILE__, __LINE__);
    Layout layout;
    plan.at_states = layout.add<SelectState>(count);
    plan.at_histogram = layout.add<u64>(count * kMaxBins<T>);
    plan.at_stage_index = layout.add<Index>(largest);
    plan.at_stage_value = layout.add<T>(largest);
    plan.at_sort = layout.add<char>(static_cast<int64_t>(plan.sort_bytes));
    plan.bytes = largest == 0 && count == 0 ? 0 : layout.bytes();
    return plan;
}

template <typename T, typename Index>
void select_batch(const SegmentedPlan<T, Index>& plan, const Batch& batch,
                  const int64_t* device_table, int64_t segments, T* gradient, T* residual,
                  bool clear_gradient, Index* out_index, T* out_value, const Workspace& workspace,
                  cudaStream_t stream, const int32_t* skip) {
    const int64_t row = segments + 1;
    const Segments view{device_table + batch.first, device_table + row + batch.first,
                        device_table + 2 * row + batch.first, batch.count};
    SelectState* states = piece<SelectState>(workspace, plan.at_states);
    u64* histogram = piece<u64>(workspace, plan.at_histogram);
    Index* stage_index = piece<Index>(workspace, plan.at_stage_index);
    T* stage_value = piece<T>(workspace, plan.at_stage_value);
    const Schedule schedule = detail::make_schedule<T>(std::max<int64_t>(batch.max_length, 1));
    const int grid = static_cast<int>(batch.chunks);
    if (grid == 0) return;  // every segment of the batch is empty
    if (gradient == nullptr && batch.selected == 0) return;  // nothing to add, nothing wanted

    GTOPK_CUDA_CHECK(cudaMemsetAsync(
        histogram, 0, static_cast<size_t>(batch.count) * kMaxBins<T> * sizeof(u64), stream));
    init_states_kernel<<<static_cast<int>(blocks_for(batch.count, kThreads)), kThreads, 0,
                         stream>>>(view, states);
    GTOPK_CUDA_CHECK_LAUNCH("init_states_kernel");
    segmented_first_pass_kernel<T><<<grid, kThreads, 0, stream>>>(
        gradient, residual, clear_gradient, view, schedule.level[0], states, histogram, skip);
    GTOPK_CUDA_CHECK_LAUNCH("segmented_first_pass_kernel");
    if (batch.selected == 0) return;  // the accumulation was all there was to do
    const int count = static_cast<int>(batch.count);
    segmented_choose_kernel<T><<<count, kThreads, 0, stream>>>(schedule.level[0], states,
                                                               histogram);
    GTOPK_CUDA_CHECK_LAUNCH("segmented_choose_kernel");
    for (int l = 1; l < schedule.count; ++l) {
        segmented_refine_kernel<T><<<grid, kThreads, 0, stream>>>(residual, view,
                                                                  schedule.level[l], states,
                                                                  histogram);
        GTOPK_CUDA_CHECK_LAUNCH("segmented_refine_kernel");
        segmented_choose_kernel<T><<<count, kThreads, 0, stream>>>(schedule.level[l], states,
                                                                   histogram);
        GTOPK_CUDA_CHECK_LAUNCH("segmented_choose_kernel");
    }
    segmented_stage_kernel<T, Index><<<grid, kThreads, 0, stream>>>(
        residual, view, states, stage_index, stage_value, skip);
    GTOPK_CUDA_CHECK_LAUNCH("segmented_stage_kernel");

    using UIndex = UnsignedOf<Index>;
    using Bits = BitsOf<T>;
    size_t sort_bytes = plan.sort_bytes;
    check_cuda(cub::DeviceRadixSort::SortPairs(
                   piece<char>(workspace, plan.at_sort), sort_bytes,
                   reinterpret_cast<const UIndex*>(stage_index),
                   reinterpret_cast<UIndex*>(out_index), reinterpret_cast<const Bits*>(stage_value),
                   reinterpret_cast<Bits*>(out_value), batch.selected, 0, batch.end_bit, stream),
               "cub::DeviceRadixSort::SortPairs", __FILE__, __LINE__);
}

template <typename T, typename Index>
int64_t segmented_typed(void* gradient, void* residual, const int64_t* host_table,
                        const int64_t* device_table, int64_t segments, void* out_index,
                        void* out_value, bool clear_gradient, cudaStream_t stream,
                        const Workspace& workspace, const int32_t* skip) {
    const HostTable rows = host_rows(host_table, segments);
    const auto plan = plan_segmented<T, Index>(rows, segments);
    T* g = static_cast<T*>(gradient);
    T* r = static_cast<T*>(residual);
    detail::with_workspace(workspace, plan.bytes, stream, [&](const Workspace& scratch) {
        for (int64_t first = 0; first < segments; first += kBatchSegments) {
            const Batch batch = batch_at(rows, first, segments);
            const int64_t out = rows.out_offsets[first];
            select_batch<T, Index>(plan, batch, device_table, segments, g, r, clear_gradient,
                                   static_cast<Index*>(out_index) + out,
                                   static_cast<T*>(out_value) + out, scratch, stream, skip);
        }
    });
    return rows.out_offsets[segments];
}

void check_table(const int64_t* host_table, int64_t segments, int64_t d) {
    if (segments < 0) throw std::invalid_argument("gtopk: a negative number of segments");
    const HostTable rows = host_rows(host_table, segments);
    std::vector<int64_t> ks(static_cast<size_t>(segments));
    for (int64_t s = 0; s < segments; ++s) ks[s] = rows.out_offsets[s + 1] - rows.out_offsets[s];
    check_segments(rows.offsets, ks.data(), segments, d);
    const std::vector<int64_t> expected = segment_table(rows.offsets, ks.data(), segments);
    if (!std::equal(expected.begin(), expected.end(), host_table)) {
        throw std::invalid_argument("gtopk: the segment table is not segment_table's");
    }
}

}  // namespace

size_t segmented_select_workspace_bytes(ValueType value_type, IndexType index_type,
                                        const int64_t* host_table, int64_t segments) {
    const HostTable rows = host_rows(host_table, segments);
    return detail::with_types<false>(value_type, index_type, "segmented_select_workspace_bytes",
                                     [&](auto v, auto i) {
        return plan_segmented<decltype(v), decltype(i)>(rows, segments).bytes;
    });
}

int64_t segmented_accumulate_select(ValueType value_type, IndexType index_type, void* gradient,
                                    void* residual, int64_t d, const int64_t* host_table,
                                    const int64_t* device_table, int64_t segments,
                                    void* out_index, void* out_value, bool clear_gradient,
                                    void* stream, Workspace workspace, const int32_t* skip) {
    detail::require_index_fits(index_type, d);
    check_table(host_table, segments, d);
    if (clear_gradient && gradient == nullptr) {
        throw std::invalid_argument("gtopk: no gradient to clear");
    }
    const auto s = static_cast<cudaStream_t>(stream);
    return detail::with_types<false>(value_type, index_type, "segmented_accumulate_select",
                                     [&](auto v, auto i) {
        return segmented_typed<decltype(v), decltype(i)>(gradient, residual, host_table,
                                                         device_table, segments, out_index,
                                                         out_value, clear_gradient, s, workspace,
                                                         skip);
    });
}

}  // namespace gtopk::cuda
