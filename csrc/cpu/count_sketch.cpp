// The count sketch of sketched SGD on the CPU: the table (accumulation pass, then the integer
// sums pass) and the estimates fused into the top-k selection's first pass. Maths:
// gtopk/count_sketch.h; contracts: gtopk/cpu_ops.h.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "gtopk/count_sketch.h"
#include "gtopk/cpu_ops.h"
#include "select_engine.h"

namespace gtopk::cpu {
namespace {

using sketch::kFloatInfKey;

constexpr int64_t kStep = 256;  // entries hashed per row at a time (vectorised loops)
constexpr int64_t kEstimateStep = 32;  // entries per gather of every row in the estimate pass
constexpr int64_t kRowChunk = int64_t{1} << 18;  // entries the table's adds take row by row
constexpr int64_t kAddPrefetch = 32;  // how far ahead the adds prefetch their cells

struct SketchShape {
    const uint32_t* keys;  // rows x (key0, key1)
    int rows;
    int64_t columns;
};

inline uint32_t float_bits(float value) {
    uint32_t bits;
    std::memcpy(&bits, &value, sizeof(bits));
    return bits;
}

inline uint32_t key_of(float value) { return float_bits(value) & 0x7FFFFFFFu; }

// The largest finite magnitude key and whether some entry is NaN or +-Inf.
struct Extremes {
    uint32_t max_finite = 0;
    bool nonfinite = false;
};

// residual += gradient over [0, d) (gradient = 0 too if clear), block by block so that the
// clearing finds the gradient still in cache; returns the extremes of the accumulated values.
// gradient == nullptr: the residual as it is (a read).
Extremes accumulate(float* gradient, float* residual, int64_t d, bool clear) {
    const int n_threads = detail::threads_for(d);
    std::vector<Extremes> per_thread(n_threads);
#pragma omp parallel num_threads(n_threads)
    {
        const int thread = omp_get_thread_num();
        const auto [begin, end] = detail::chunk_of(d, thread, n_threads);
        uint32_t max_finite = 0, max_key = 0;
        for (int64_t b = begin; b < end; b += kStep) {
            const int64_t n = std::min(kStep, end - b);
            float* r = residual + b;
            if (gradient != nullptr) {
                float* g = gradient + b;
                for (int64_t e = 0; e < n; ++e) r[e] += g[e];
                if (clear) std::fill(g, g + n, 0.0f);
            }
            for (int64_t e = 0; e < n; ++e) {
                const uint32_t key = key_of(r[e]);
                max_key = std::max(max_key, key);
                max_finite = std::max(max_finite, key < kFloatInfKey ? key : 0u);
            }
        }
        per_thread[thread] = {max_finite, max_key >= kFloatInfKey};
    }
    Extremes all;
    for (const Extremes& mine : per_thread) {
        all.max_finite = std::max(all.max_finite, mine.max_finite);
        all.nonfinite = all.nonfinite || mine.nonfinite;
    }
    return all;
}

// Buckets of row key0 for the n entries from `first`, which lie in one 2^32 span (the blocks
// start at multiples of 32).
void hash_buckets(uint64_t first, int64_t n, uint32_t key0, uint32_t columns, uint32_t* bucket) {
    const uint32_t span0 = sketch::span_key(first, key0);
    const uint32_t low = static_cast<uint32_t>(first);
    for (int64_t e = 0; e < n; ++e) {
        const uint32_t lo = low + static_cast<uint32_t>(e);
        bucket[e] = sketch::bucket_of_word(sketch::mix32(lo ^ span0), columns);
    }
}

// Hashes of row (key0, key1) for the n entries from `first` (as hash_buckets): buckets, and
// sign masks (all ones where s_j(i) = -1), in one loop (the table's hot loop: measurably
// faster than hash_buckets and a second loop for the signs).
void hash_row(uint64_t first, int64_t n, uint32_t key0, uint32_t key1, uint32_t columns,
              uint32_t* bucket, uint64_t* sign_mask) {
    const uint32_t span0 = sketch::span_key(first, key0), span1 = sketch::span_key(first, key1);
    const uint32_t low = static_cast<uint32_t>(first);
    for (int64_t e = 0; e < n; ++e) {
        const uint32_t lo = low + static_cast<uint32_t>(e);
        bucket[e] = sketch::bucket_of_word(sketch::mix32(lo ^ span0), columns);
        sign_mask[e] = uint64_t{0} - (sketch::mix32(lo ^ span1) >> 31);
    }
}

// q(i) = rint(acc[i] 2^s) as int64 bits, 0 for a non-finite entry (masked to +0 first, without
// a branch, so that the loop vectorises).
inline uint64_t quantised(float value, double scale) {
    const uint32_t bits = key_of(value) < kFloatInfKey ? ~0u : 0u;
    const float finite = sketch::float_of_bits(float_bits(value) & bits);
    return static_cast<uint64_t>(
        static_cast<int64_t>(std::rint(static_cast<double>(finite) * scale)));
}

// Adds s_j(i) q(i) for i in [begin, end) into sums (rows x columns, int64 as two's-complement
// uint64, so that wrapping is defined and the adds commute), and the flags of non-finite terms
// into flags (only when the caller saw a non-finite entry). Atomic: relaxed atomic adds into a
// table that other threads share. Row by row over chunks of kRowChunk entries, so that the adds
// land in one row's sums (which a core's L2 cache holds at the default shape up to d ~ 2^25)
// rather than in all rows' at once; q(i) is computed again for each row (cheaper than storing).
template <bool Atomic>
void add_terms(const float* acc, int64_t begin, int64_t end, const SketchShape& shape,
               double scale, bool nonfinite, uint64_t* sums, uint32_t* flags) {
    uint64_t q[kStep], sign_mask[kStep];
    uint32_t bucket[kStep];
    const uint32_t columns = static_cast<uint32_t>(shape.columns);
    for (int64_t chunk = begin; chunk < end; chunk += kRowChunk) {
        const int64_t chunk_end = std::min(end, chunk + kRowChunk);
        for (int j = 0; j < shape.rows; ++j) {
            uint64_t* row = sums + j * shape.columns;
            for (int64_t b = chunk; b < chunk_end; b += kStep) {
                const int64_t n = std::min(kStep, chunk_end - b);
                for (int64_t e = 0; e < n; ++e) q[e] = quantised(acc[b + e], scale);
                hash_row(static_cast<uint64_t>(b), n, shape.keys[2 * j], shape.keys[2 * j + 1],
                         columns, bucket, sign_mask);
                for (int64_t e = 0; e < std::min(n, kAddPrefetch); ++e) {
                    __builtin_prefetch(&row[bucket[e]], 1);
                }
                for (int64_t e = 0; e < n; ++e) {
                    if (e + kAddPrefetch < n) __builtin_prefetch(&row[bucket[e + kAddPrefetch]], 1);
                    const uint64_t term = (q[e] ^ sign_mask[e]) - sign_mask[e];  // -q if masked
                    if constexpr (Atomic) {
                        __atomic_fetch_add(&row[bucket[e]], term, __ATOMIC_RELAXED);
                    } else {
                        row[bucket[e]] += term;
                    }
                }
                if (!nonfinite) continue;
                for (int64_t e = 0; e < n; ++e) {
                    const float value = acc[b + e];
                    if (key_of(value) < kFloatInfKey) continue;
                    __atomic_fetch_or(&flags[j * shape.columns + bucket[e]],
                                      sketch::nonfinite_flag(value, sign_mask[e] != 0),
                                      __ATOMIC_RELAXED);
                }
            }
        }
    }
}

// Whether each thread may sum into a table of its own: the extra tables take at most the
// bytes of one float32 vector of d.
bool private_tables_fit(int n_threads, int64_t cells, int64_t d) {
    return n_threads > 1 && (n_threads - 1) * cells * int64_t{8} <= 4 * d;
}

// sums = the integer sums of the whole table (rows x columns), by every thread.
void integer_sums(const float* acc, int64_t d, const SketchShape& shape, double scale,
                  bool nonfinite, uint64_t* sums, uint32_t* flags) {
    const int n_threads = detail::threads_for(d);
    const int64_t cells = shape.rows * shape.columns;
    if (!private_tables_fit(n_threads, cells, d)) {
#pragma omp parallel num_threads(n_threads)
        {
            const auto [begin, end] = detail::chunk_of(d, omp_get_thread_num(), n_threads);
            if (n_threads > 1) {
                add_terms<true>(acc, begin, end, shape, scale, nonfinite, sums, flags);
            } else {
                add_terms<false>(acc, begin, end, shape, scale, nonfinite, sums, flags);
            }
        }
        return;
    }
    std::vector<uint64_t> extra(static_cast<size_t>((n_threads - 1) * cells), 0);
#pragma omp parallel num_threads(n_threads)
    {
        const int thread = omp_get_thread_num();
        const auto [begin, end] = detail::chunk_of(d, thread, n_threads);
        uint64_t* mine = thread == 0 ? sums : extra.data() + (thread - 1) * cells;
        add_terms<false>(acc, begin, end, shape, scale, nonfinite, mine, flags);
#pragma omp barrier
        const auto [first, last] = detail::chunk_of(cells, thread, n_threads);
        for (int t = 1; t < n_threads; ++t) {
            const uint64_t* theirs = extra.data() + (t - 1) * cells;
            for (int64_t c = first; c < last; ++c) sums[c] += theirs[c];
        }
    }
}

// The rows x kEstimateStep row values s_j(i) S[j, h_j(i)] of entries [first, first + n),
// row-major; the entries must lie in one 2^32 span (`hash_row`'s rule: so does a block of at
// most 32 from a multiple of 32).
void gather_rows(const float* table, const SketchShape& shape, uint64_t first, int64_t n,
                 float* values) {
    uint32_t bucket[kEstimateStep];
    uint64_t sign_mask[kEstimateStep];
    for (int j = 0; j < shape.rows; ++j) {
        hash_row(first, n, shape.keys[2 * j], shape.keys[2 * j + 1],
                 static_cast<uint32_t>(shape.columns), bucket, sign_mask);
        const float* row = table + j * shape.columns;
        float* out = values + j * kEstimateStep;
        for (int64_t e = 0; e < n; ++e) {  // the sign as a bit flip: no branch to mispredict
            const uint32_t flip = static_cast<uint32_t>(sign_mask[e]) & 0x80000000u;
            out[e] = sketch::float_of_bits(float_bits(row[bucket[e]]) ^ flip);
        }
    }
}

// sketch::median of each of the n columns of values (rows x kEstimateStep), by the same rank
// rule, up to 32 entries at a time (the loops over e vectorised, `omp simd`, whatever n: for the
// sample's 16 the compiler's own choice ran them in its scalar remainder, with branches).
void medians(const float* values, int rows, int64_t n, float* out) {
    float lo[kEstimateStep] = {}, hi[kEstimateStep] = {};
    bool any_nan[kEstimateStep] = {};
    int rank[kEstimateStep];
    for (int j = 0; j < rows; ++j) {
        const float* v = values + j * kEstimateStep;
#pragma omp simd
        for (int64_t e = 0; e < n; ++e) {
            rank[e] = 0;
            any_nan[e] = any_nan[e] || v[e] != v[e];
        }
        for (int m = 0; m < rows; ++m) {
            const float* other = values + m * kEstimateStep;
            if (m < j) {
#pragma omp simd
                for (int64_t e = 0; e < n; ++e) rank[e] += other[e] <= v[e];
            } else if (m > j) {
#pragma omp simd
                for (int64_t e = 0; e < n; ++e) rank[e] += other[e] < v[e];
            }
        }
#pragma omp simd
        for (int64_t e = 0; e < n; ++e) {
            lo[e] = rank[e] == (rows - 1) / 2 ? v[e] : lo[e];
            hi[e] = rank[e] == rows / 2 ? v[e] : hi[e];
        }
    }
#pragma omp simd
    for (int64_t e = 0; e < n; ++e) out[e] = sketch::median_of_middle(lo[e], hi[e], rows, any_nan[e]);
}

// est(i) computed into `estimate` as the selection engine reads each block (its first pass
// runs over every block exactly once), or on the fly for its sample.
struct EstimateSource {
    static constexpr bool kHasSideEffects = true;
    static constexpr bool kSampledInGroups = true;
    const float* table;
    SketchShape shape;
    float* estimate;

    float at(int64_t i) const {
        float values[sketch::kMaxRows];
        for (int j = 0; j < shape.rows; ++j) {
            values[j] = sketch::row_value(table + j * shape.columns, static_cast<uint64_t>(i),
                                          shape.keys[2 * j], shape.keys[2 * j + 1],
                                          shape.columns);
        }
        return sketch::median(values, shape.rows);
    }

    // The sample's runs, every row's values gathered for the kGroup entries together (as
    // `block` does) where they lie in one 2^32 span (`hash_row`'s rule), else one at a time.
    void group(int64_t begin, float* out) const {
        static_assert(detail::kGroup <= kEstimateStep);
        if (static_cast<uint32_t>(begin) > UINT32_MAX - (detail::kGroup - 1)) {
            for (int e = 0; e < detail::kGroup; ++e) out[e] = at(begin + e);
            return;
        }
        float values[sketch::kMaxRows * kEstimateStep];
        gather_rows(table, shape, static_cast<uint64_t>(begin), detail::kGroup, values);
        medians(values, shape.rows, detail::kGroup, out);
    }

    // begin: a multiple of the engine's block (256).
    const float* block(int64_t begin, int64_t n) {
        float values[sketch::kMaxRows * kEstimateStep];
        for (int64_t s = 0; s < n; s += kEstimateStep) {
            const int64_t m = std::min(kEstimateStep, n - s);
            gather_rows(table, shape, static_cast<uint64_t>(begin + s), m, values);
            medians(values, shape.rows, m, estimate + begin + s);
        }
        return estimate + begin;
    }

    const float* values() const { return estimate; }
};

// Candidates of the sampled threshold t without the estimates of every entry: a bit per cell,
// |S[j, c]| >= t, then one hashed bit read per row an entry, est(i) computed only where
// sketch::may_reach (gtopk/count_sketch.h) allows it, and kept if |est(i)| >= t, in index
// order: the candidates of the engine's filter pass (select_engine.h) over the estimates,
// without them. The bitmaps take rows x columns bits (a 32nd of the table). False, as for too
// many candidates, when a cell is at or above sketch::kFilterMaxKey (the rule does not hold).
template <typename Index>
bool filter_without_estimates(const EstimateSource& source, int64_t d, uint32_t threshold,
                              int64_t cap, std::vector<detail::Candidate<float, Index>>& out) {
    const SketchShape& shape = source.shape;
    const int64_t words_per_row = (shape.columns + 63) / 64;
    std::vector<uint64_t> bits(static_cast<size_t>(shape.rows * words_per_row), 0);
    uint32_t max_key = 0;
    for (int j = 0; j < shape.rows; ++j) {
        const float* row = source.table + j * shape.columns;
        uint64_t* row_bits = bits.data() + j * words_per_row;
        for (int64_t c = 0; c < shape.columns; ++c) {
            const uint32_t key = key_of(row[c]);
            max_key = std::max(max_key, key);
            row_bits[c / 64] |= uint64_t{key >= threshold} << (c % 64);
        }
    }
    if (max_key >= sketch::kFilterMaxKey) return false;
    const uint32_t columns = static_cast<uint32_t>(shape.columns);
    const int n_threads = detail::threads_for(d);
    std::vector<detail::ThreadCandidates<float, Index>> per_thread(n_threads);
#pragma omp parallel num_threads(n_threads)
    {
        auto& mine = per_thread[omp_get_thread_num()];
        const auto [begin, end] = detail::chunk_of(d, omp_get_thread_num(), n_threads);
        uint32_t bucket[kStep];
        uint8_t above[kStep];
        for (int64_t b = begin; b < end && !mine.overflow; b += kStep) {
            const int64_t n = std::min(kStep, end - b);
            std::fill(above, above + n, uint8_t{0});
            for (int j = 0; j < shape.rows; ++j) {
                hash_buckets(static_cast<uint64_t>(b), n, shape.keys[2 * j], columns, bucket);
                const uint64_t* row_bits = bits.data() + j * words_per_row;
                for (int64_t e = 0; e < n; ++e) {
                    const uint64_t word = row_bits[bucket[e] / 64];
                    above[e] += static_cast<uint8_t>((word >> (bucket[e] % 64)) & 1);
                }
            }
            for (int64_t e = 0; e < n; ++e) {
                if (!sketch::may_reach(above[e], shape.rows)) continue;
                const float value = source.at(b + e);
                const uint32_t key = magnitude_key(value);
                if (key >= threshold) {
                    mine.items.push_back({key, static_cast<Index>(b + e), value});
                }
            }
            mine.overflow = static_cast<int64_t>(mine.items.size()) > cap;
        }
    }
    size_t total = 0;
    for (const auto& mine : per_thread) {
        if (mine.overflow) return false;
        total += mine.items.size();
    }
    if (static_cast<int64_t>(total) > cap) return false;
    out.clear();
    out.reserve(total);
    for (const auto& mine : per_thread) {
        out.insert(out.end(), mine.items.begin(), mine.items.end());
    }
    return true;
}

}  // namespace

void sketch_table(float* gradient, float* residual, int64_t d, const uint32_t* keys, int rows,
                  int64_t columns, bool clear_gradient, float* table) {
    const SketchShape shape{keys, rows, columns};
    const int64_t cells = rows * columns;
    const Extremes extremes = accumulate(gradient, residual, d, clear_gradient);
    const int s = sketch::scale_exponent(extremes.max_finite, std::max<int64_t>(d, 1));
    std::vector<uint64_t> sums(static_cast<size_t>(cells), 0);
    std::vector<uint32_t> flags(extremes.nonfinite ? static_cast<size_t>(cells) : 0, 0);
    integer_sums(residual, d, shape, std::ldexp(1.0, s), extremes.nonfinite, sums.data(),
                 flags.data());
    const double inverse_scale = std::ldexp(1.0, -s);
    const int n_threads = detail::threads_for(cells);
#pragma omp parallel for num_threads(n_threads) schedule(static)
    for (int64_t c = 0; c < cells; ++c) {
        table[c] = sketch::table_value(static_cast<int64_t>(sums[c]),
                                       extremes.nonfinite ? flags[c] : 0u, inverse_scale);
    }
}

template <typename Index>
int64_t sketch_select(const float* table, const uint32_t* keys, int rows, int64_t columns,
                      int64_t d, int64_t k, float* estimate, Index* out_index, float* out_value) {
    const SketchShape shape{keys, rows, columns};
    const int64_t n = std::clamp<int64_t>(k, 0, d);
    if (estimate == nullptr && n == 0) return 0;
    if (estimate == nullptr && n * detail::kGuessMaxFraction <= d &&
        d > detail::kGuessMinInput) {
        // The engine's first two steps (select_engine.h), its filter over the row bitmaps.
        EstimateSource sampled{table, shape, nullptr};
        uint32_t threshold;
        int64_t cap;
        std::vector<detail::Candidate<float, Index>> candidates;
        if (detail::sampled_threshold<float>(sampled, d, n, threshold, cap) &&
            filter_without_estimates<Index>(sampled, d, threshold, cap, candidates) &&
            static_cast<int64_t>(candidates.size()) >= n) {
            detail::finish_exact(candidates, n, out_index, out_value);
            return n;
        }
    }
    std::vector<float> buffer(estimate == nullptr ? static_cast<size_t>(d) : 0);
    EstimateSource source{table, shape, estimate == nullptr ? buffer.data() : estimate};
    return detail::select_topk<float, Index>(source, d, k, nullptr, out_index, out_value);
}

template int64_t sketch_select<int32_t>(const float*, const uint32_t*, int, int64_t, int64_t,
                                        int64_t, float*, int32_t*, float*);
template int64_t sketch_select<int64_t>(const float*, const uint32_t*, int, int64_t, int64_t,
                                        int64_t, float*, int64_t*, float*);

}  // namespace gtopk::cpu
