// CPU kernels of gtopk_hvd. Selection order and NaN rule: magnitude_order.h.
//
// Every function writes its result sorted by index, with unique indices, and returns the
// number of entries written. Output buffers must hold min(k, number of candidates) entries.
// Index is int32_t (when int32_indices_fit(d), types.h) or int64_t.
#pragma once

#include <cstdint>
#include <vector>

#include "gtopk/magnitude_order.h"
#include "gtopk/types.h"

namespace gtopk::cpu {

// Top-min(k, d) entries of x[0..d) by magnitude.
// threshold_hint (nullable): a magnitude believed to be at or below the k-th largest |x|, e.g.
// 0.8 x the smallest |value| the previous step selected. It only changes the speed: a wrong hint
// costs one extra pass, never a different result.
template <typename T, typename Index>
int64_t topk_abs(const T* x, int64_t d, int64_t k, const T* threshold_hint, Index* out_index,
                 T* out_value);

// Error-feedback step fused into one pass over d:
//   residual += gradient;  (out_index, out_value) = topk_abs(residual, k);  residual[out_index] = 0
// and, if clear_gradient, gradient = 0 in the same pass (gradient is only written then).
template <typename T, typename Index>
int64_t accumulate_select(T* gradient, T* residual, int64_t d, int64_t k,
                          const T* threshold_hint, Index* out_index, T* out_value,
                          bool clear_gradient);

// accumulate_select over each segment of a vector (gtopk/segments.h) with its own k, in one
// call: for s = 0 .. segments - 1, with [b, e) = [offsets[s], offsets[s + 1]),
//   residual[b:e) += gradient[b:e);  top-min(ks[s], e - b) of residual[b:e) by magnitude
//   (magnitude_order.h, indices local to the segment for the ties);  residual there = 0
// (gradient = 0 too if clear_gradient). The entries go to out_index / out_value at
// out_offsets[s], with indices into the whole vector (b + local index), so the outputs are the
// segments' results concatenated in segment order, sorted by index. Bit for bit what
// accumulate_select gives on each segment. gradient == nullptr: the residual already holds
// the sum (topk_abs of each segment, zeroed there). float / double. Returns out_offsets[S].
template <typename T, typename Index>
int64_t segmented_accumulate_select(T* gradient, T* residual, const int64_t* offsets,
                                    const int64_t* ks, int64_t segments, Index* out_index,
                                    T* out_value, bool clear_gradient);

// Threshold selection fused with the accumulation (MiCRO, ExDyna), one pass over d:
//   residual += gradient over [0, d)                 (gradient = 0 there too if clear_gradient)
//   out_index = { i in [begin, end) : key(residual[i]) >= max(threshold, histogram_base) },
//               sorted (NaN: always in, unless threshold is above NaN's key: none selected)
//   histogram[b] = #{ i in [begin, end) : key >= histogram_base, bin(key) = b }, where with
//   o = key - histogram_base: bin = o >> histogram_shift for the first n_fine bins, then
//   n_fine + ((o - (n_fine << histogram_shift)) >> coarse_shift), and at most n_bins - 1
//   (n_fine < 0: every bin is a fine one)
// Keys are magnitude_key's; entries below histogram_base are not counted. The histogram and the
// compare read only the entries at or above histogram_base (a vectorised mask), so the pass
// costs about the accumulation alone when few entries reach it.
// gradient == nullptr: no accumulation (and nothing to clear): the histogram and the selection
// of residual as it is, a read of [begin, end) (a second look at a threshold, or a residual that
// already holds the accumulated gradient).
template <typename T, typename Index>
void accumulate_threshold(T* gradient, T* residual, int64_t d, int64_t begin, int64_t end,
                          MagnitudeKey<T> threshold, MagnitudeKey<T> histogram_base,
                          int histogram_shift, int64_t n_bins, int64_t* histogram,
                          bool clear_gradient, std::vector<Index>& out_index,
                          int64_t n_fine = -1, int coarse_shift = 0);

// out_index = { i in [begin, end) : key(x[i]) >= threshold }, sorted: a read of [begin, end).
template <typename T, typename Index>
void threshold_indices(const T* x, int64_t begin, int64_t end, MagnitudeKey<T> threshold,
                       std::vector<Index>& out_index);

// dest = 0 except dest[index[j]] = value[j]: one multi-threaded pass over d. index is sorted.
template <typename T, typename Index>
void write_sparse(T* dest, int64_t d, const Index* index, const T* value, int64_t n);

// Sparse merge with re-selection. a and b are index-sorted with unique indices.
// union(a, b) with values summed where an index is in both, then its top-k.
// Symmetric: merge(a, b) and merge(b, a) are bitwise equal (addition commutes; NaN sums are
// canonicalised).
template <typename T, typename Index>
int64_t merge_topk(const Index* index_a, const T* value_a, int64_t n_a, const Index* index_b,
                   const T* value_b, int64_t n_b, int64_t k, Index* out_index, T* out_value);

// residual[index[j]] += value[j] for every j with restore[j] != 0 (entries of the local
// selection that did not survive the global reduction go back into the residual).
template <typename T, typename Index>
void restore_residual(T* residual, int64_t d, const Index* index, const T* value,
                      const uint8_t* restore, int64_t n);

// Marks, for each entry of the index-sorted local set, whether its index is in the index-sorted
// global set: survived[j] = local_index[j] in global_index.
template <typename Index>
void mark_survivors(const Index* local_index, int64_t n_local, const Index* global_index,
                    int64_t n_global, uint8_t* survived);

// Count sketch of sketched SGD (hashes, fixed-point sums, median: gtopk/count_sketch.h).
// keys: rows x 2 uint32 (key0_j, key1_j), 1 <= rows <= sketch::kMaxRows; 1 <= columns < 2^32.
//
// sketch_table: residual += gradient over [0, d) (gradient = 0 too if clear_gradient; gradient
// == nullptr: the residual as it is), and table[j * columns + b] = S[j, b], the count sketch of
// the accumulated residual, float32.
// Two passes over d: the accumulation (with the largest finite magnitude, for the scale), then
// the table's integer sums, row by row over chunks of entries (per-thread tables where they
// fit, else relaxed atomic adds: integer sums, so the result does not depend on the threads).
void sketch_table(float* gradient, float* residual, int64_t d, const uint32_t* keys, int rows,
                  int64_t columns, bool clear_gradient, float* table);

// sketch_select: the top-min(k, d) of est(i), i < d, by magnitude (magnitude_order.h) into
// (out_index, out_value), sorted by index, from the (summed) table.
// estimate == nullptr: nothing of d entries is stored. A threshold t sampled from est, a bitmap
// of |S[j, c]| >= t per row (rows x columns bits), then one pass over d that reads a bit per row
// an entry and computes est(i) only where ceil(rows / 2) bits are set (no other entry has
// |est(i)| >= t); when the guess misses (fewer than k, or too many, at or above t) or the table
// holds a non-finite or huge (>= 2^126) value, the estimates go to a temporary buffer of d and
// the selection runs over it.
// estimate != nullptr: estimate[i] = est(i) for all i < d, computed block by block inside the
// selection's first pass (k = 0: the estimates only), plus a second read of estimate when the
// sampled threshold misses.
// Either way the same entries and values (the one selection order).
template <typename Index>
int64_t sketch_select(const float* table, const uint32_t* keys, int rows, int64_t columns,
                      int64_t d, int64_t k, float* estimate, Index* out_index, float* out_value);

// The first position j in [1, n) where index[j] <= index[j - 1], or 0 when index[0..n) is
// strictly increasing (sorted, no duplicates): the input contract of every kernel that takes an
// index set. One multi-threaded read.
template <typename Index> int64_t first_not_increasing(const Index* index, int64_t n);

// Benchmark floor: reads x once with all threads; returns the largest magnitude key.
template <typename T> uint64_t read_pass(const T* x, int64_t d);

// The largest magnitude key of x[i] + y[i] (of x[i] when y == nullptr) over i in [0, n), in one
// multi-threaded read, without a temporary; finite_only: over the finite values only (keys below
// the key of +inf), 0 if there is none (and 0 for n == 0). So x holds a NaN or an Inf iff
// max_key(x, nullptr, n, false) >= key(+inf). T: float, double, or the 16-bit types (y must
// then be nullptr).
template <typename T> uint64_t max_key(const T* x, const T* y, int64_t n, bool finite_only);

// out = the sorted union of a[0..n_a) and b[0..n_b) (each strictly increasing), each index once:
// a linear merge; returns its length. out holds n_a + n_b entries.
template <typename Index>
int64_t sorted_union(const Index* a, int64_t n_a, const Index* b, int64_t n_b, Index* out);

// The vector paths compiled in: "avx512", "avx2" or "scalar" (see simd_level.cpp).
const char* simd_level();

// Threads of every multi-threaded kernel (inputs below 2^15 entries always use one).
// 0 (the default): OpenMP's own choice, omp_get_max_threads() (OMP_NUM_THREADS).
void set_max_threads(int n);
int max_threads();

}  // namespace gtopk::cpu
