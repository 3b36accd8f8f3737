// The count sketch of sketched SGD (gtopk_hvd/schemes/sketch.py): the hashes, the fixed-point
// sums of the table and the median of rows, shared by the CPU and CUDA kernels so that both
// compute the same table and the same estimates bit for bit.
//
// Hashes. Row j has two 32-bit keys (key0_j, key1_j), the same on every worker (drawn from the
// configuration's seed). With mix32 MurmurHash3's finaliser and, for an index i,
//     word(i, key) = mix32(lo32(i) ^ key ^ mix32(hi32(i)))          (mix32(0) = 0: for i < 2^32
//                                                                    the word is mix32(i ^ key))
//     h_j(i) = (word(i, key0_j) * columns) >> 32                    (bucket in [0, columns))
//     s_j(i) = -1 if word(i, key1_j) >> 31 else +1                   (sign)
//
// Table sums, exactly and in any order. A worker's table is S[j, b] = sum over h_j(i) = b of
// s_j(i) acc[i]; the kernels sum integers, not floats, so that no summation order matters:
//     E = the least integer >= -126 with every finite |acc[i]| < 2^E
//     L = ceil(log2 d)                                                    (0 for d = 1)
//     s = 62 - L - E                                                      (the scale exponent)
//     q(i) = rint(acc[i] 2^s)          (in float64, exact, then to the nearest int64, ties even)
//     Q[j, b] = sum over h_j(i) = b of s_j(i) q(i)                  (int64: |sum| <= d 2^(62-L))
//     S[j, b] = float32(float64(Q[j, b]) 2^-s)                  (two roundings to nearest even)
// so every |acc[i]| is resolved to 2^-s = 2^(E + L - 62): about 2^-37 of the largest entry at
// d = 2^25, far below float32's own 2^-24. Non-finite entries are not quantised: a bucket that
// receives a NaN, or both +Inf and -Inf (after the sign), is NaN; one that receives +Inf
// (-Inf) only is +Inf (-Inf): what any float sum of those terms gives.
//
// Estimates. est(i) = median over j of s_j(i) S[j, h_j(i)] (negation flips the sign bit):
// the middle value for odd rows, (lo + hi) * 0.5 in float32 for even rows (lo, hi the middle
// two); NaN (0x7FC00000) if any of the row values is NaN; a zero median is +0.0.
#pragma once

#include <cstdint>
#include <cstring>

#include "gtopk/magnitude_order.h"

namespace gtopk::sketch {

constexpr int kMaxRows = 64;
constexpr int64_t kMaxColumns = 0xFFFFFFFFll;  // buckets are 32-bit products' high halves
constexpr uint32_t kFloatInfKey = 0x7F800000u;  // magnitude key of +-Inf; NaNs are above it
constexpr uint32_t kCanonicalNanBits = 0x7FC00000u;

// Non-finite terms of one bucket, OR-ed together (flags of S[j, b]).
constexpr uint32_t kPositiveInf = 1u, kNegativeInf = 2u, kNan = 4u;

GTOPK_HOST_DEVICE uint32_t mix32(uint32_t x) {
    x ^= x >> 16;
    x *= 0x85EBCA6Bu;
    x ^= x >> 13;
    x *= 0xC2B2AE35u;
    return x ^ (x >> 16);
}

// key ^ mix32(hi32(i)): what word() xors into lo32(i); the same for every i of one 2^32 span.
GTOPK_HOST_DEVICE uint32_t span_key(uint64_t i, uint32_t key) {
    return key ^ mix32(static_cast<uint32_t>(i >> 32));
}

GTOPK_HOST_DEVICE uint32_t word(uint64_t i, uint32_t key) {
    return mix32(static_cast<uint32_t>(i) ^ span_key(i, key));
}

// (word * columns) >> 32 for columns < 2^32: a 32 x 32 -> 64-bit product (vectorises).
GTOPK_HOST_DEVICE uint32_t bucket_of_word(uint32_t w, uint32_t columns) {
    return static_cast<uint32_t>((uint64_t{w} * columns) >> 32);
}

GTOPK_HOST_DEVICE int64_t bucket(uint64_t i, uint32_t key0, int64_t columns) {
    return bucket_of_word(word(i, key0), static_cast<uint32_t>(columns));
}

GTOPK_HOST_DEVICE bool negative(uint64_t i, uint32_t key1) { return (word(i, key1) >> 31) != 0; }

// s = 62 - L - E from the largest finite magnitude key of acc and d >= 1.
GTOPK_HOST_DEVICE int scale_exponent(uint32_t max_finite_key, int64_t d) {
    const int biased = static_cast<int>(max_finite_key >> 23);
    const int e = (biased > 1 ? biased : 1) - 126;
    int l = 0;
    while ((int64_t{1} << l) < d) ++l;
    return 62 - l - e;
}

GTOPK_HOST_DEVICE float float_of_bits(uint32_t bits) {
    float value;
    std::memcpy(&value, &bits, sizeof(value));
    return value;
}

// S[j, b] from its integer sum, its non-finite flags and 2^-s.
GTOPK_HOST_DEVICE float table_value(int64_t sum, uint32_t flags, double inverse_scale) {
    if ((flags & kNan) != 0 || (flags & (kPositiveInf | kNegativeInf)) ==
                                   (kPositiveInf | kNegativeInf)) {
        return float_of_bits(kCanonicalNanBits);
    }
    if (flags == kPositiveInf) return float_of_bits(kFloatInfKey);
    if (flags == kNegativeInf) return float_of_bits(kFloatInfKey | 0x80000000u);
    return static_cast<float>(static_cast<double>(sum) * inverse_scale);
}

// The flag of one non-finite term s_j(i) acc[i] (acc[i] has key >= kFloatInfKey).
GTOPK_HOST_DEVICE uint32_t nonfinite_flag(float value, bool negate) {
    if (value != value) return kNan;
    return (value > 0.0f) != negate ? kPositiveInf : kNegativeInf;
}

// The rank of v[j] among v[0..rows) in the order (value, row): #{m < j : v[m] <= v[j]} +
// #{m > j : v[m] < v[j]}; a permutation of 0..rows-1 when no value is NaN.
GTOPK_HOST_DEVICE int rank_of(const float* v, int rows, int j) {
    int rank = 0;
    for (int m = 0; m < rows; ++m) rank += m < j ? (v[m] <= v[j]) : m > j ? (v[m] < v[j]) : 0;
    return rank;
}

// The median from the middle order statistics: lo = rank (rows - 1) / 2, hi = rank rows / 2.
GTOPK_HOST_DEVICE float median_of_middle(float lo, float hi, int rows, bool any_nan) {
    if (any_nan) return float_of_bits(kCanonicalNanBits);
    const float middle = rows % 2 == 1 ? hi : (lo + hi) * 0.5f;
    return middle == 0.0f ? 0.0f : middle;
}

// The median of v[0..rows) as the header states (ranks, no sorting: CPU and CUDA run this rule;
// the CPU's block loop is the same rule over 32 entries at a time).
GTOPK_HOST_DEVICE float median(const float* v, int rows) {
    float lo = 0.0f, hi = 0.0f;
    bool any_nan = false;
    for (int j = 0; j < rows; ++j) {
        any_nan = any_nan || v[j] != v[j];
        const int rank = rank_of(v, rows, j);
        lo = rank == (rows - 1) / 2 ? v[j] : lo;
        hi = rank == rows / 2 ? v[j] : hi;
    }
    return median_of_middle(lo, hi, rows, any_nan);
}

// The row-bitmap filter of both selections: if |est(i)| >= t, then at least ceil(rows / 2) of
// the row values |s_j(i) S[j, h_j(i)]| are >= t (odd rows: the median and the values ranked
// beyond it; even rows: (lo + hi) * 0.5 is at most hi, rounding being monotone, and hi and the
// values beyond it; likewise below -t). So with a bit per cell, |S[j, c]| >= t, an entry whose
// rows have fewer bits set cannot reach t. It needs every cell below kFilterMaxKey in
// magnitude (finite and < 2^126): no NaN median, no (lo + hi) overflowing.
constexpr uint32_t kFilterMaxKey = uint32_t{126 + 127} << 23;

// Whether an entry with `set` of its rows' bits set may reach the threshold.
GTOPK_HOST_DEVICE bool may_reach(int set, int rows) { return 2 * set >= rows; }

// s_j(i) S[j, h_j(i)] for row j with keys (key0, key1).
GTOPK_HOST_DEVICE float row_value(const float* table_row, uint64_t i, uint32_t key0,
                                  uint32_t key1, int64_t columns) {
    const float value = table_row[bucket(i, key0, columns)];
    return negative(i, key1) ? -value : value;
}

}  // namespace gtopk::sketch
