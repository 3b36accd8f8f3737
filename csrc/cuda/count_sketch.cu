// gtopk::cuda::sketch_table, sketch_select and sketch_estimate: the count sketch of sketched SGD
// on the GPU, with the hashes, integer sums and median of gtopk/count_sketch.h, so that the table
// and the estimates equal the CPU kernels' bit for bit.
//
// sketch_table, no synchronisation:
//   1. one pass over d: residual += gradient (gradient = 0 when clearing; no gradient: a read of
//      the residual), and the largest finite magnitude key (a warp max, then one atomicMax per
//      warp);
//   2. the table in tiles, each a range of at most T columns of one row (T: half the L2 cache in
//      int64 sums, at most the row): a read of d that adds q(i) of every entry whose bucket falls
//      in the tile to the tile's int64 sums with 64-bit integer atomics (integer adds commute:
//      the order of the atomics does not matter; the tile's sums stay in the L2 cache), the
//      scale read from step 1's result on the device; non-finite entries OR their flag into the
//      tile's cells of the output table (zeroed first: the flags need no memory of their own);
//      then the tile's S[j, b] from its sums and flags, in place of the flags, the sums zeroed
//      for the next tile. rows x ceil(columns / T) reads of d in all (rows at the sizes where a
//      row fits half the L2 cache), rows integer atomics an entry, and the workspace is one
//      tile's sums, not the table's.
// sketch_select: the top-k of |est| by the selection engine (gtopk/select_engine.cuh) whose passes
// compute est(i) from the table as they read entry i (rows gathers from the table, issued together,
// and the median of rows, in registers for rows <= kUnrolledRows): no d-entry estimate buffer, and
// typically one pass over the entries. Where the engine guesses a first-digit bin from its sample,
// its pass 1 reads one bit per row an entry from bitmaps of the cells at or above that bin, built
// between the sample and pass 1 (RowBitmaps), and gathers and takes the median only where half the
// rows' bits are set: the table's floats are read for a small share of d.
// sketch_estimate: est(i) for every i written to a d-entry buffer (one pass; tests and tools).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "cuda_check.cuh"
#include "device.cuh"
#include "gtopk/count_sketch.h"
#include "gtopk/cuda_ops.h"
#include "select/agent/digits.cuh"
#include "select/dispatch/launch.cuh"

namespace gtopk::cuda {
namespace {

using detail::kThreads;
using detail::u64;

constexpr int kUnrolledRows = 8;  // rows up to this bound keep their row values in registers

void check_shape(int rows, int64_t columns, const char* what) {
    if (rows < 1 || rows > sketch::kMaxRows || columns < 1 || columns > sketch::kMaxColumns) {
        throw std::invalid_argument(std::string("gtopk::cuda::") + what + ": need 1 <= rows <= " +
                                    std::to_string(sketch::kMaxRows) +
                                    " and 1 <= columns < 2^32, got " +
                                    std::to_string(rows) + " x " + std::to_string(columns));
    }
}

// The header's median rule (count_sketch.h: ranks in the order (value, row), the middle two),
// with loops bounded at compile time so that the row values stay in registers.
template <int Bound>
__device__ __forceinline__ float unrolled_median(const float (&v)[Bound], int rows) {
    float lo = 0.0f, hi = 0.0f;
    bool any_nan = false;
#pragma unroll
    for (int j = 0; j < Bound; ++j) {
        if (j < rows) {
            any_nan = any_nan || v[j] != v[j];
            int rank = 0;
#pragma unroll
            for (int m = 0; m < Bound; ++m) {
                if (m < rows) rank += m < j ? (v[m] <= v[j]) : m > j ? (v[m] < v[j]) : 0;
            }
            lo = rank == (rows - 1) / 2 ? v[j] : lo;
            hi = rank == rows / 2 ? v[j] : hi;
        }
    }
    return sketch::median_of_middle(lo, hi, rows, any_nan);
}

// est(i) of a table, as a value source of the selection engine (load and peek alike, and keep
// nothing: computing an estimate has no side effects). Bound: the most rows it holds keys for.
template <int Bound> struct SketchEstimates {
    const float* table;
    int64_t columns;
    int rows;
    uint32_t keys[2 * Bound];

    __device__ float load(int64_t i) const { return peek(i); }
    __device__ void keep(int64_t, float) const {}
    __device__ float peek(int64_t i) const {
        const auto index = static_cast<uint64_t>(i);
        float v[Bound];
        if constexpr (Bound <= kUnrolledRows) {
            // The rows' cell addresses first (hashes only for j < rows: the same branch for the
            // whole warp), then the loads, each predicated on j < rows rather than behind the
            // hash's branch: an entry's row loads are in flight together.
            const float* cells[Bound];
#pragma unroll
            for (int j = 0; j < Bound; ++j) cells[j] = j < rows ? cell(index, j) : table;
#pragma unroll
            for (int j = 0; j < Bound; ++j) v[j] = j < rows ? __ldg(cells[j]) : 0.0f;
#pragma unroll
            for (int j = 0; j < Bound; ++j) v[j] = j < rows ? with_sign(index, j, v[j]) : 0.0f;
            return unrolled_median<Bound>(v, rows);
        } else {
            for (int j = 0; j < rows; ++j) v[j] = with_sign(index, j, __ldg(cell(index, j)));
            return sketch::median(v, rows);
        }
    }
    // sketch::row_value in two halves: the cell S[j, h_j(i)] (read through the read-only data
    // cache: the table does not change while a selection reads it), and its sign s_j(i).
    __device__ const float* cell(uint64_t index, int j) const {
        return table + j * columns + sketch::bucket(index, keys[2 * j], columns);
    }
    __device__ float with_sign(uint64_t index, int j, float value) const {
        return sketch::negative(index, keys[2 * j + 1]) ? -value : value;
    }
};

// Calls body(estimates) with the SketchEstimates of the table, the smallest bound that holds
// its rows.
template <typename Body>
auto with_estimates(const float* table, const uint32_t* keys, int rows, int64_t columns,
                    Body&& body) {
    auto fill = [&](auto& estimates) {
        estimates.table = table;
        estimates.columns = columns;
        estimates.rows = rows;
        std::copy(keys, keys + 2 * rows, estimates.keys);
    };
    if (rows <= kUnrolledRows) {
        SketchEstimates<kUnrolledRows> estimates{};
        fill(estimates);
        return body(estimates);
    }
    SketchEstimates<sketch::kMaxRows> estimates{};
    fill(estimates);
    return body(estimates);
}

// The row bitmaps of the selection's pass 1 (the rule: sketch::may_reach, count_sketch.h): bit
// (j, c) set when S[j, c]'s first digit (the engine's 12 top key bits) is at or above the
// guessed bin g > 0, so that an entry whose first digit can reach g has its rows' bits set;
// `off` set when a cell is at or above sketch::kFilterMaxKey (the rule does not hold). Pass 1
// then computes est(i) only where the bits allow it, and reads 0 (below g: not looked at)
// elsewhere.
struct RowBitmaps {
    uint32_t* words;        // rows x words_per_row, bit c % 32 of word c / 32 for column c
    int64_t words_per_row;  // ceil(columns / 32)
    unsigned int* off;      // nonzero: every entry's estimate is computed

    static int64_t words_for(int64_t columns) { return (columns + 31) / 32; }
    static size_t bytes_for(int rows, int64_t columns) {
        return (static_cast<size_t>(rows) * words_for(columns) + 1) * sizeof(uint32_t);
    }
};

// One warp per word: lane b reads column 32 w + b of the row, the ballot is the word.
__global__ void __launch_bounds__(kThreads)
row_bitmaps_kernel(const float* table, int rows, int64_t columns, RowBitmaps bitmaps,
                   detail::Level first, const detail::SelectState* state) {
    const int guess = state->guess_bin;
    if (guess <= 0) return;  // no guessed bin: pass 1 reads every estimate (the filter is off)
    const int64_t slots = rows * bitmaps.words_per_row * 32;
    const int lane = threadIdx.x % 32;
    const int64_t stride = int64_t{gridDim.x} * blockDim.x;
    for (int64_t base = blockIdx.x * int64_t{blockDim.x} + threadIdx.x - lane; base < slots;
         base += stride) {
        const int64_t word = base / 32;
        const int64_t j = word / bitmaps.words_per_row;
        const int64_t c = (word % bitmaps.words_per_row) * 32 + lane;
        bool bit = false, bad = false;
        if (c < columns) {
            const uint32_t key = __float_as_uint(table[j * columns + c]) & 0x7FFFFFFFu;
            bad = key >= sketch::kFilterMaxKey;
            bit = static_cast<int>(detail::digit_of(first, key, 0)) >= guess;
        }
        const unsigned bits = __ballot_sync(0xFFFFFFFFu, bit);
        const bool any_bad = __any_sync(0xFFFFFFFFu, bad);
        if (lane == 0) {
            bitmaps.words[word] = bits;
            if (any_bad) atomicOr(bitmaps.off, 1u);
        }
    }
}

// Pass 1's value source: est(i) where i's row bits allow it to reach the guessed bin, else 0
// (RowBitmaps); the sample and the later passes read the estimates themselves (peek).
template <int Bound> struct FilteredEstimates {
    SketchEstimates<Bound> exact;
    RowBitmaps bitmaps;
    const detail::SelectState* state;
    bool filtering = false;  // read on the device, once per kernel (on_device)

    __device__ float load(int64_t i) const {
        return filtering && !may_reach(static_cast<uint64_t>(i)) ? 0.0f : exact.peek(i);
    }
    __device__ void keep(int64_t, float) const {}
    __device__ float peek(int64_t i) const { return exact.peek(i); }
    __device__ bool may_reach(uint64_t index) const {
        const auto columns = static_cast<uint32_t>(exact.columns);
        int set = 0;
        if constexpr (Bound <= kUnrolledRows) {  // as SketchEstimates::peek: addresses, then loads
            uint32_t bits[Bound];
            const uint32_t* words[Bound];
#pragma unroll
            for (int j = 0; j < Bound; ++j) {
                bits[j] = j < exact.rows
                              ? sketch::bucket_of_word(sketch::word(index, exact.keys[2 * j]),
                                                       columns)
                              : 0u;
                words[j] = bitmaps.words + j * bitmaps.words_per_row + bits[j] / 32;
            }
#pragma unroll
            for (int j = 0; j < Bound; ++j) {
                set += j < exact.rows ? (__ldg(words[j]) >> (bits[j] % 32)) & 1u : 0u;
            }
        } else {
            for (int j = 0; j < exact.rows; ++j) {
                const uint32_t b =
                    sketch::bucket_of_word(sketch::word(index, exact.keys[2 * j]), columns);
                set += (__ldg(bitmaps.words + j * bitmaps.words_per_row + b / 32) >> (b % 32)) &
                       1u;
            }
        }
        return sketch::may_reach(set, exact.rows);
    }
};

template <int Bound>
__device__ __forceinline__ FilteredEstimates<Bound> on_device(FilteredEstimates<Bound> values) {
    values.filtering = values.state->guess_bin > 0 && *values.bitmaps.off == 0;
    return values;
}

int grid_for(int64_t count) {
    const int device = detail::current_device();
    const int64_t resident = int64_t{std::max(detail::sm_count(device), 1)} * 8;
    return static_cast<int>(std::min(resident, detail::blocks_for(count, kThreads)));
}

constexpr int kBatch = 8;  // entries a thread loads before it uses (or writes back) them

// This thread's entries of [0, d), grid-strided, kBatch at a time: load(i) for every entry of a
// batch first, then use(i, value) for each. A store between two loads that may alias it would
// hold the later load behind the earlier one's round trip; use may store.
template <typename Load, typename Use>
__device__ __forceinline__ void for_each_batch(int64_t d, Load&& load, Use&& use) {
    const int64_t stride = int64_t{gridDim.x} * blockDim.x;
    for (int64_t first = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; first < d;
         first += kBatch * stride) {
        float value[kBatch];
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
            const int64_t i = first + b * stride;
            value[b] = i < d ? load(i) : 0.0f;
        }
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
            const int64_t i = first + b * stride;
            if (i < d) use(i, value[b]);
        }
    }
}

// extremes[0] = largest finite magnitude key (gradient == nullptr, or the skip flag set: of the
// residual as it is, left so; the gradient is still cleared if asked).
__global__ void __launch_bounds__(kThreads)
accumulate_extremes_kernel(float* gradient, float* residual, int64_t d, bool clear_gradient,
                           unsigned int* extremes, const int32_t* skip) {
    const bool accumulate = gradient != nullptr && !detail::flag_set(skip);
    unsigned int max_finite = 0;
    for_each_batch(
        d, [&](int64_t i) { return accumulate ? residual[i] + gradient[i] : residual[i]; },
        [&](int64_t i, float value) {
            if (accumulate) residual[i] = value;
            if (gradient != nullptr && clear_gradient) gradient[i] = 0.0f;
            const unsigned int key = __float_as_uint(value) & 0x7FFFFFFFu;
            max_finite = max(max_finite, key < sketch::kFloatInfKey ? key : 0u);
        });
    max_finite = __reduce_max_sync(0xFFFFFFFFu, max_finite);
    if (threadIdx.x % 32 == 0 && max_finite != 0) atomicMax(&extremes[0], max_finite);
}

// One tile, columns [begin, begin + n) of one row (keys key0, key1): for every entry i whose
// bucket b falls in it, sums[b - begin] += s(i) q(i), or cells[b - begin] |= its non-finite flag.
__global__ void __launch_bounds__(kThreads)
tile_sums_kernel(const float* acc, int64_t d, uint32_t key0, uint32_t key1, uint32_t columns,
                 uint32_t begin, uint32_t n, const unsigned int* extremes, u64* sums,
                 unsigned int* cells) {
    const double scale = ldexp(1.0, sketch::scale_exponent(extremes[0], d > 1 ? d : 1));
    for_each_batch(
        d, [&](int64_t i) { return __ldcs(acc + i); },  // streamed: the tile's sums keep L2
        [&](int64_t i, float value) {
            const auto index = static_cast<uint64_t>(i);
            // Buckets below `begin` wrap to offsets >= n.
            const uint32_t offset =
                sketch::bucket_of_word(sketch::word(index, key0), columns) - begin;
            if (offset >= n) return;
            const bool negate = sketch::negative(index, key1);
            if ((__float_as_uint(value) & 0x7FFFFFFFu) < sketch::kFloatInfKey) {
                const auto q = static_cast<u64>(
                    static_cast<long long>(rint(static_cast<double>(value) * scale)));
                if (q != 0) atomicAdd(&sums[offset], negate ? 0ull - q : q);
            } else {
                atomicOr(&cells[offset], sketch::nonfinite_flag(value, negate));
            }
        });
}

// cells[c] (the flags on entry) = the bits of S from sums[c] and the flags; sums[c] = 0.
__global__ void __launch_bounds__(kThreads)
tile_values_kernel(u64* sums, int64_t n, int64_t d, const unsigned int* extremes,
                   unsigned int* cells) {
    const double inverse_scale = ldexp(1.0, -sketch::scale_exponent(extremes[0], d > 1 ? d : 1));
    for (int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; c < n;
         c += int64_t{gridDim.x} * blockDim.x) {
        const float value =
            sketch::table_value(static_cast<int64_t>(sums[c]), cells[c], inverse_scale);
        sums[c] = 0;
        cells[c] = __float_as_uint(value);
    }
}

template <typename Estimates>
__global__ void __launch_bounds__(kThreads)
estimate_kernel(Estimates estimates, int64_t d, float* estimate) {
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < d;
         i += int64_t{gridDim.x} * blockDim.x) {
        estimate[i] = estimates.peek(i);
    }
}

// k >= d: every entry, (i, est(i)).
template <typename Index, typename Estimates>
__global__ void __launch_bounds__(kThreads)
take_all_kernel(Estimates estimates, int64_t d, Index* out_index, float* out_value) {
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < d;
         i += int64_t{gridDim.x} * blockDim.x) {
        out_index[i] = static_cast<Index>(i);
        out_value[i] = estimates.peek(i);
    }
}

// Columns of a tile: `requested` if positive (at most a row); else a row split into as few
// equal tiles as keep each within half the L2 cache of int64 sums (at least 2^16 sums).
int64_t tile_columns_for(int64_t columns, int64_t requested) {
    if (requested > 0) return std::min(columns, requested);
    const int64_t l2 = detail::l2_bytes(detail::current_device());
    const int64_t fit = std::max<int64_t>(int64_t{1} << 16, l2 / 2 / int64_t{sizeof(u64)});
    const int64_t tiles = (columns + fit - 1) / fit;
    return (columns + tiles - 1) / tiles;
}

// Workspace of sketch_table: one tile's int64 sums, the extremes.
struct TableLayout {
    size_t sums, extremes, bytes;
    explicit TableLayout(int64_t tile) {
        detail::Layout layout;
        sums = layout.add<u64>(tile);
        extremes = layout.add<unsigned int>(1);
        bytes = layout.bytes();
    }
};

// Workspace of sketch_select: the engine's (at most `engine` bytes), then the row bitmaps.
struct SelectLayout {
    size_t words, bytes;
    SelectLayout(size_t engine, int rows, int64_t columns) {
        detail::Layout layout;
        layout.add<char>(static_cast<int64_t>(engine));
        words = layout.add<char>(static_cast<int64_t>(RowBitmaps::bytes_for(rows, columns)));
        bytes = layout.bytes();
    }
};

template <typename Index, int Bound>
int64_t select_typed(const SketchEstimates<Bound>& estimates, int64_t d, int64_t k,
                     void* out_index, float* out_value, cudaStream_t stream,
                     const Workspace& workspace) {
    using Estimates = SketchEstimates<Bound>;
    const int64_t n = std::clamp<int64_t>(k, 0, d);
    if (n == 0) return 0;
    auto* index_out = static_cast<Index*>(out_index);
    if (n == d) {
        take_all_kernel<Index, Estimates>
            <<<grid_for(d), kThreads, 0, stream>>>(estimates, d, index_out, out_value);
        GTOPK_CUDA_CHECK_LAUNCH("take_all_kernel");
        return n;
    }
    const auto plan = detail::plan_select<float, Index>(d, n);
    const SelectLayout layout(plan.bytes, estimates.rows, estimates.columns);
    // A given workspace without room for the bitmaps (sized by an older caller): no filter.
    if (!plan.guess || (workspace.data != nullptr && workspace.bytes < layout.bytes)) {
        detail::with_workspace(workspace, plan.bytes, stream, [&](const Workspace& scratch) {
            detail::select_topk_from<float, Index>(plan, estimates, estimates, index_out,
                                                   out_value, nullptr, scratch, stream);
        });
        return n;
    }
    detail::with_workspace(workspace, layout.bytes, stream, [&](const Workspace& scratch) {
        const int64_t words_per_row = RowBitmaps::words_for(estimates.columns);
        uint32_t* words = detail::piece<uint32_t>(scratch, layout.words);
        const RowBitmaps bitmaps{words, words_per_row, words + estimates.rows * words_per_row};
        // The engine's state lies at the plan's place: pass 1's source reads the guess there.
        const FilteredEstimates<Bound> filtered{
            estimates, bitmaps, detail::piece<detail::SelectState>(scratch, plan.at_state)};
        auto build_bitmaps = [&](const detail::SelectState* state, const detail::Level& first,
                                 cudaStream_t s) {
            GTOPK_CUDA_CHECK(cudaMemsetAsync(bitmaps.off, 0, sizeof(unsigned int), s));
            const int64_t slots = estimates.rows * bitmaps.words_per_row * 32;
            row_bitmaps_kernel<<<grid_for(slots), kThreads, 0, s>>>(
                estimates.table, estimates.rows, estimates.columns, bitmaps, first, state);
            GTOPK_CUDA_CHECK_LAUNCH("row_bitmaps_kernel");
        };
        detail::select_topk_from<float, Index>(plan, filtered, estimates, index_out, out_value,
                                               nullptr, scratch, stream, nullptr, build_bitmaps);
    });
    return n;
}

}  // namespace

size_t sketch_table_workspace_bytes(int rows, int64_t columns, int64_t tile_columns) {
    check_shape(rows, columns, "sketch_table_workspace_bytes");
    return TableLayout(tile_columns_for(columns, tile_columns)).bytes;
}

void sketch_table(float* gradient, float* residual, int64_t d, const uint32_t* keys, int rows,
                  int64_t columns, bool clear_gradient, float* table, void* stream,
                  Workspace workspace, int64_t tile_columns, const int32_t* skip) {
    if (d < 0) throw std::invalid_argument("gtopk::cuda::sketch_table: d < 0");
    check_shape(rows, columns, "sketch_table");
    const int64_t tile = tile_columns_for(columns, tile_columns);
    const TableLayout layout(tile);
    const auto s = static_cast<cudaStream_t>(stream);
    auto* cells = reinterpret_cast<unsigned int*>(table);  // the flags, then S
    detail::with_workspace(workspace, layout.bytes, s, [&](const Workspace& scratch) {
        u64* sums = detail::piece<u64>(scratch, layout.sums);
        auto* extremes = detail::piece<unsigned int>(scratch, layout.extremes);
        GTOPK_CUDA_CHECK(cudaMemsetAsync(scratch.data, 0, layout.bytes, s));
        GTOPK_CUDA_CHECK(cudaMemsetAsync(cells, 0, rows * columns * sizeof(float), s));
        if (d > 0) {
            accumulate_extremes_kernel<<<grid_for(d), kThreads, 0, s>>>(
                gradient, residual, d, clear_gradient, extremes, skip);
            GTOPK_CUDA_CHECK_LAUNCH("accumulate_extremes_kernel");
        }
        for (int j = 0; j < rows; ++j) {
            for (int64_t begin = 0; begin < columns; begin += tile) {
                const int64_t n = std::min(tile, columns - begin);
                unsigned int* tile_cells = cells + j * columns + begin;
                if (d > 0) {
                    tile_sums_kernel<<<grid_for(d), kThreads, 0, s>>>(
                        residual, d, keys[2 * j], keys[2 * j + 1],
                        static_cast<uint32_t>(columns), static_cast<uint32_t>(begin),
                        static_cast<uint32_t>(n), extremes, sums, tile_cells);
                    GTOPK_CUDA_CHECK_LAUNCH("tile_sums_kernel");
                }
                tile_values_kernel<<<grid_for(n), kThreads, 0, s>>>(sums, n, d, extremes,
                                                                    tile_cells);
                GTOPK_CUDA_CHECK_LAUNCH("tile_values_kernel");
            }
        }
    });
}

size_t sketch_select_workspace_bytes(IndexType index_type, int64_t d, int64_t k, int rows,
                                     int64_t columns) {
    check_shape(rows, columns, "sketch_select_workspace_bytes");
    const size_t engine = select_workspace_bytes(ValueType::kFloat32, index_type, d, k);
    const int64_t n = std::clamp<int64_t>(k, 0, d);
    if (n == 0 || n == d || !detail::plan_select<float, int64_t>(d, n).guess) return engine;
    return SelectLayout(engine, rows, columns).bytes;
}

int64_t sketch_select(const float* table, const uint32_t* keys, int rows, int64_t columns,
                      int64_t d, int64_t k, IndexType index_type, void* out_index,
                      float* out_value, void* stream, Workspace workspace) {
    if (d < 0) throw std::invalid_argument("gtopk::cuda::sketch_select: d < 0");
    check_shape(rows, columns, "sketch_select");
    detail::require_index_fits(index_type, d);
    const auto s = static_cast<cudaStream_t>(stream);
    return with_estimates(table, keys, rows, columns, [&](const auto& estimates) {
        switch (index_type) {
            case IndexType::kInt32:
                return select_typed<int32_t>(estimates, d, k, out_index, out_value, s, workspace);
            case IndexType::kInt64:
                return select_typed<int64_t>(estimates, d, k, out_index, out_value, s, workspace);
        }
        throw std::invalid_argument("gtopk::cuda::sketch_select: unsupported index type");
    });
}

void sketch_estimate(const float* table, const uint32_t* keys, int rows, int64_t columns,
                     int64_t d, float* estimate, void* stream) {
    if (d < 0) throw std::invalid_argument("gtopk::cuda::sketch_estimate: d < 0");
    check_shape(rows, columns, "sketch_estimate");
    if (d == 0) return;
    const auto s = static_cast<cudaStream_t>(stream);
    with_estimates(table, keys, rows, columns, [&](const auto& estimates) {
        using Estimates = std::decay_t<decltype(estimates)>;
        estimate_kernel<Estimates><<<grid_for(d), kThreads, 0, s>>>(estimates, d, estimate);
        GTOPK_CUDA_CHECK_LAUNCH("estimate_kernel");
    });
}

}  // namespace gtopk::cuda
