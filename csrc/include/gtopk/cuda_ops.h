// CUDA kernels of gtopk_hvd: the same operations and contracts as cpu_ops.h, on device memory.
//
// All pointers are device pointers of the current device (but accumulate_count's histogram, in
// host memory). `stream` is a cudaStream_t passed as void* (nullptr: the legacy default
// stream); work is enqueued on it. Functions whose result count is data-dependent (merge_topk
// unless one set holds k entries, accumulate_count, threshold_indices) synchronise the stream to
// return it, unless asked to leave it in device memory; the others return min(k, d) without
// synchronising. Errors (CUDA failures) are thrown as std::runtime_error naming the CUDA call;
// bad arguments as std::invalid_argument.
//
// Scratch memory: `workspace` is device memory of at least the bytes that the matching
// *_workspace_bytes function returns for the same arguments, 256-byte aligned, left to the
// work this call enqueues on `stream` (e.g. a tensor from torch's caching allocator on that
// stream). Without one (data == nullptr), the call uses a workspace cached per device, grown as
// needed and shared in turn by every stream of the device.
#pragma once

#include <cstddef>
#include <cstdint>

#include "gtopk/magnitude_order.h"
#include "gtopk/types.h"

namespace gtopk::cuda {

struct Workspace {
    void* data = nullptr;
    size_t bytes = 0;
};

// Workspace of topk_abs and of accumulate_select.
size_t select_workspace_bytes(ValueType value_type, IndexType index_type, int64_t d, int64_t k);

// Top-min(k, d) entries of x by magnitude (order and NaN rule: magnitude_order.h), written
// sorted by index into out_index (IndexType) and out_value (ValueType).
int64_t topk_abs(ValueType value_type, IndexType index_type, const void* x, int64_t d, int64_t k,
                 void* out_index, void* out_value, void* stream, Workspace workspace = {});

// residual += gradient; top-k of residual; residual[selected] = 0. float32 / float64 only.
// skip: null, or one int32 in device memory that the kernels read (so the host need not know
// it): when it is nonzero, nothing is written to the residual and the result is the top-k of
// the residual as it is (a valid set: a step skipped on the device, docs/ddp.md).
int64_t accumulate_select(ValueType value_type, IndexType index_type, const void* gradient,
                          void* residual, int64_t d, int64_t k, void* out_index, void* out_value,
                          void* stream, Workspace workspace = {}, const int32_t* skip = nullptr);

// cpu::segmented_accumulate_select on the device: accumulate_select over each segment of a
// vector of d values with its own k, the outputs concatenated in segment order with indices
// into the whole vector, bit for bit the per-segment accumulate_select results (and the CPU
// kernel's, but for NaN payloads). The segments are given by their table (gtopk/segments.h):
// host_table, segment_table(offsets, ks) in host memory, and device_table, a copy of it in
// device memory (built once by the caller and kept: no copy per call). gradient == nullptr: the
// residual already holds the sum (nothing is added; clear_gradient must be false). One fixed
// sequence of launches per 256 segments, whatever their sizes (segmented_select.cu).
// float32 / float64 only. Returns the table's out_offsets[segments] without synchronising.
// skip: as accumulate_select's (when set, the residual is read as it is and left so; the
// gradient is still cleared if asked).
size_t segmented_select_workspace_bytes(ValueType value_type, IndexType index_type,
                                        const int64_t* host_table, int64_t segments);
int64_t segmented_accumulate_select(ValueType value_type, IndexType index_type, void* gradient,
                                    void* residual, int64_t d, const int64_t* host_table,
                                    const int64_t* device_table, int64_t segments,
                                    void* out_index, void* out_value, bool clear_gradient,
                                    void* stream, Workspace workspace = {},
                                    const int32_t* skip = nullptr);

size_t merge_topk_workspace_bytes(ValueType value_type, IndexType index_type, int64_t n_a,
                                  int64_t n_b, int64_t k);

// union of two index-sorted sets with values summed, then top-k, index-sorted.
// float32 / float64 only. Symmetric in (a, b) bit for bit. When one set holds at least k entries
// (so the result holds k), enqueues only and returns k; otherwise synchronises `stream` to
// return min(k, union).
int64_t merge_topk(ValueType value_type, IndexType index_type, const void* index_a,
                   const void* value_a, int64_t n_a, const void* index_b, const void* value_b,
                   int64_t n_b, int64_t k, void* out_index, void* out_value, void* stream,
                   Workspace workspace = {});

// velocity = momentum * velocity + gradient / divisor over n values (the division only when
// divisor != 1), each operation rounded on its own (no fused multiply-add): the host's
// `velocity *= momentum; velocity += gradient / divisor`, bit for bit, in one pass. momentum and
// divisor are converted to the value type first. float32 / float64 only. Enqueued on `stream`,
// no host wait, no scratch. skip: as accumulate_select's (when set, the velocity is left as it
// is).
void momentum_update(ValueType value_type, void* velocity, const void* gradient, int64_t n,
                     double momentum, double divisor, void* stream,
                     const int32_t* skip = nullptr);

// residual[index[j]] += value[j] where restore[j] != 0. float32 / float64 only. No scratch.
void restore_residual(ValueType value_type, IndexType index_type, void* residual,
                      const void* index, const void* value, const uint8_t* restore, int64_t n,
                      void* stream);

// residual[index[j]] += value[j] for each j < n whose index[j] is not in selected[0, n_selected)
// (sorted ascending; a binary search per entry): restore_residual with the mask "not selected",
// bit for bit, in one launch. Nothing when the skip flag (as accumulate_select's) is set.
// float32 / float64 values, int32 / int64 indices (both sets of one index type). No scratch,
// no host wait.
void restore_unselected(ValueType value_type, IndexType index_type, void* residual,
                        const void* index, const void* value, int64_t n, const void* selected,
                        int64_t n_selected, void* stream, const int32_t* skip = nullptr);

// x[index[j]] = 0 for each j < n (indices may repeat), in one launch; nothing when the skip flag
// (as accumulate_select's) is set. float32 / float64 values, int32 / int64 indices. No scratch,
// no host wait.
void zero_at(ValueType value_type, IndexType index_type, void* x, const void* index, int64_t n,
             void* stream, const int32_t* skip = nullptr);

// The union schemes' gather at a global set, in one launch: for each j < n,
//   out[j] = residual[index[j]] (+ taken_value[m] where taken_index[m] == index[j])
//   residual[index[j]] = 0                                  (left as it is when skip is set)
// index: sorted ascending, distinct; taken_index[0, n_taken): sorted ascending, distinct, of
// the same index type (a binary search per entry; entries taken but not in index are ignored).
// The sum is one rounding, residual + taken, as on the host (the framework sequence it replaces,
// a gather, a search, a clamp, a compare, a where, an index add and a clear, added with
// atomics, which flush float32 subnormals to zero). float32 / float64 values, int32 / int64
// indices. No scratch, no host wait.
void take_at(ValueType value_type, IndexType index_type, void* residual, const void* index,
             int64_t n, const void* taken_index, const void* taken_value, int64_t n_taken,
             void* out, void* stream, const int32_t* skip = nullptr);

// dest[0, d) = 0 except dest[index[j]] = value[j] for j < n (indices distinct): a fill and a
// scatter, at most two launches. zeroed: dest already holds zeros, so the fill is left out. When
// the skip flag (as accumulate_select's) is set, dest is all NaN instead (read on the device:
// with zeroed, a small launch that returns at once unless it is set). float32 / float64 values,
// int32 / int64 indices. No scratch, no host wait.
void write_sparse(ValueType value_type, IndexType index_type, void* dest, int64_t d,
                  const void* index, const void* value, int64_t n, bool zeroed, void* stream,
                  const int32_t* skip = nullptr);

// Threshold selection (MiCRO, ExDyna), the first of two calls: one pass over d that
//   residual += gradient over [0, d)                  (gradient = 0 there too if clear_gradient)
//   histogram[b] = #{ i in [begin, end) : key(residual[i]) >= histogram_base, bin(key) = b }
// and returns #{ i in [begin, end) : key(residual[i]) >= max(threshold, histogram_base) }: the
// count of cpu::accumulate_threshold's selection, whose keys, bins (gtopk/histogram_bins.h) and
// argument rules it shares (gtopk/cpu_ops.h). histogram is host memory of n_bins int64.
// float32 / float64 only. Synchronises `stream`. The accumulated values equal the CPU kernel's
// bit for bit but for NaN payloads (a GPU's float32 arithmetic returns one canonical NaN).
// gradient == nullptr: no accumulation (nothing is written): the histogram and the count of
// residual as it is, a read of [begin, end) (cpu::accumulate_threshold's rule).
// device_counts != nullptr: n_bins + 1 int64 of device memory that receive the histogram, then
// the count; nothing is copied to the host and nothing waits (histogram is not read; returns
// -1): the caller reads them with the other buckets', one wait for all.
size_t accumulate_count_workspace_bytes(int64_t n_bins);
int64_t accumulate_count(ValueType value_type, void* gradient, void* residual, int64_t d,
                         int64_t begin, int64_t end, uint64_t threshold, uint64_t histogram_base,
                         int histogram_shift, int64_t n_bins, int64_t n_fine, int coarse_shift,
                         bool clear_gradient, int64_t* histogram, void* stream,
                         Workspace workspace = {}, int64_t* device_counts = nullptr);

// out_index = { i in [begin, end) : key(x[i]) >= threshold }, sorted; returns their number.
// out_index holds `capacity` entries: only the first capacity selected are written, so a
// capacity below the count (a bound that was not one) writes nothing beyond out_index and
// returns the whole count, which the caller compares with capacity. A capacity that holds them
// all: end - begin, the count accumulate_count returned for the same x, range and
// max(threshold, histogram_base) as `threshold`, or the histogram's bins from threshold's on.
// x has d entries. float32 / float64 only. Synchronises `stream`, unless device_count !=
// nullptr: one int64 of device memory that receives the count; then nothing waits and -1
// is returned (the caller reads the count later and compares it with capacity itself).
size_t threshold_indices_workspace_bytes(ValueType value_type, IndexType index_type, int64_t n);
int64_t threshold_indices(ValueType value_type, IndexType index_type, const void* x, int64_t d,
                          int64_t begin, int64_t end, uint64_t threshold, void* out_index,
                          int64_t capacity, void* stream, Workspace workspace = {},
                          int64_t* device_count = nullptr);

// Count sketch of sketched SGD (gtopk/count_sketch.h): the tables and estimates of
// cpu::sketch_table and cpu::sketch_select bit for bit (integer sums: the atomics' order does not
// matter); the accumulated residual too but for NaN payloads. keys: host memory, rows x 2
// uint32, 1 <= rows <= sketch::kMaxRows; 1 <= columns < 2^32. No call synchronises `stream`.
//
// sketch_table: residual += gradient (gradient = 0 if clear_gradient; gradient == nullptr: the
// residual as it is), table (rows x columns float32, device) = S of the accumulated residual:
// one pass over d, then the table in tiles of at most tile_columns columns of one row (0: half
// the L2 cache's worth of int64 sums), one read of d per tile; the workspace holds one tile's
// sums. skip: as accumulate_select's (when set, the table is the residual's as it is, and the
// residual is left so; the gradient is still cleared if asked).
// sketch_select: the top-min(k, d) of |est(i)|, i < d, as topk_abs orders them (index-sorted
// (indices, values = est)), est computed from the table inside the selection's passes (no
// d-entry buffer): returns the count. Where the engine guesses from a sample (k <= d / 16),
// pass 1 first reads one bit per row an entry from bitmaps of the table's cells at or above
// the guessed bin (rows x columns bits in the workspace) and computes est(i) only where half
// the rows' bits are set: no other entry can reach the bin. A given workspace smaller than
// sketch_select_workspace_bytes but at least select_workspace_bytes' runs without them.
// sketch_estimate: estimate[i] = est(i) for i < d, one pass.
size_t sketch_table_workspace_bytes(int rows, int64_t columns, int64_t tile_columns = 0);
void sketch_table(float* gradient, float* residual, int64_t d, const uint32_t* keys, int rows,
                  int64_t columns, bool clear_gradient, float* table, void* stream,
                  Workspace workspace = {}, int64_t tile_columns = 0,
                  const int32_t* skip = nullptr);
size_t sketch_select_workspace_bytes(IndexType index_type, int64_t d, int64_t k, int rows,
                                     int64_t columns);
int64_t sketch_select(const float* table, const uint32_t* keys, int rows, int64_t columns,
                      int64_t d, int64_t k, IndexType index_type, void* out_index,
                      float* out_value, void* stream, Workspace workspace = {});
void sketch_estimate(const float* table, const uint32_t* keys, int rows, int64_t columns,
                     int64_t d, float* estimate, void* stream);
// cpu::max_key on the device: the largest magnitude key of x[i] + y[i] (of x[i] when
// y == nullptr) over [0, n), finite values only when finite_only (0 if none), in one read by
// cub::DeviceReduce over a transform of the input: no temporary the size of x. All four value
// types (y must be nullptr for the 16-bit ones). Synchronises `stream`.
size_t max_key_workspace_bytes(ValueType value_type, int64_t n);
uint64_t max_key(ValueType value_type, const void* x, const void* y, int64_t n, bool finite_only,
                 void* stream, Workspace workspace = {});
// all_finite without the host: *flag = 1 if x[0, n) holds a NaN or +-Inf (left as it is
// otherwise), the same reduction as max_key then a one-thread compare with +Inf's key, both
// enqueued on `stream`: no copy to the host and no wait, so the caller reads one flag for many
// tensors. `flag` is one int32 on the device. Workspace: max_key_workspace_bytes(n).
void mark_nonfinite(ValueType value_type, const void* x, int64_t n, int32_t* flag, void* stream,
                    Workspace workspace = {});

}  // namespace gtopk::cuda
