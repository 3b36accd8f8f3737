// The exact top-k selection engine behind every CPU kernel.
//
// Plan for d values and n = min(k, d) outputs (order: magnitude_order.h):
//   1. Guess a threshold key T at or below the n-th largest key: the caller's hint, else the
//      (r+1)-th largest of s samples (s/16 runs of 16 values, one cache line each, evenly spread),
//      r = m + 3 sqrt(m) + 2, m = n s / d: T is below the n-th key unless the sample holds more
//      than r of the top n (a 3-sigma event), and about (r+1) d / s entries pass it.
//   2. One pass over the values, multi-threaded over contiguous chunks: keep (key, index, value)
//      of every entry with key >= T. The chunks are in index order, so the candidates are too.
//   3. If n <= c <= cap candidates survived: nth_element on their keys finds the n-th key K and
//      how many entries equal to K the top n holds; the candidates above K, and that many equal
//      to K in index order, are output.
//   4. Otherwise (hint or sample was wrong, or heavy ties): radix select over the whole input
//      with 16-bit digits of the key finds the exact n-th key K; all entries with key > K and the
//      first (n - #above) entries with key == K in index order are output.
// Inputs up to kSmallInput that keep too many entries to guess (more than 1/16), or are no
// longer than kGuessMinInput, are handled by step 3 alone (every entry is a candidate).
#pragma once

#include <omp.h>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "gtopk/cpu_ops.h"
#include "gtopk/magnitude_order.h"

namespace gtopk::cpu::detail {

constexpr int64_t kBlock = 256;
constexpr int kGroup = 16;  // one 64-byte line of float32: the unit rescanned on a hit
constexpr int64_t kSmallInput = int64_t{1} << 16;
// Inputs longer than this guess a threshold from a sample when they keep few entries (a sample
// of all of a short input, then a filter, costs far less than ordering every entry).
constexpr int64_t kGuessMinInput = int64_t{1} << 8;
constexpr int64_t kSampleSize = int64_t{1} << 16;
constexpr int64_t kParallelMin = int64_t{1} << 15;
// Guessing a threshold pays off only when few entries are kept.
constexpr int64_t kGuessMaxFraction = 16;

template <typename T> using KeyOf = typename MagnitudeTraits<T>::Key;

template <typename T, typename Index> struct Candidate {
    KeyOf<T> key;
    Index index;
    T value;
};

// One thread's candidates, on cache lines of its own (no false sharing between threads).
template <typename T, typename Index> struct alignas(64) ThreadCandidates {
    std::vector<Candidate<T, Index>> items;
    int64_t ties = 0;  // radix_select: entries equal to the k-th key seen so far
    bool overflow = false;
};

// [begin, end) of thread `thread`'s chunk: contiguous, block-aligned, in thread order.
inline std::pair<int64_t, int64_t> chunk_of(int64_t d, int thread, int n_threads) {
    const int64_t blocks = (d + kBlock - 1) / kBlock;
    const int64_t first = blocks * thread / n_threads;
    const int64_t last = blocks * (thread + 1) / n_threads;
    return {std::min(d, first * kBlock), std::min(d, last * kBlock)};
}

inline int threads_for(int64_t d) { return d >= kParallelMin ? max_threads() : 1; }

// The largest magnitude key in values[0..n): a max over the sign-masked bits, which vectorises,
// then the NaN canonicalisation (min commutes with max).
template <typename T> KeyOf<T> block_max_key(const T* values, int64_t n) {
    using Traits = MagnitudeTraits<T>;
    using Key = KeyOf<T>;
    typedef Key __attribute__((may_alias)) AliasedKey;
    const AliasedKey* bits = reinterpret_cast<const AliasedKey*>(values);
    Key largest = 0;
    for (int64_t j = 0; j < n; ++j) {
        const Key key = bits[j] & Traits::kMagnitudeMask;
        largest = key > largest ? key : largest;
    }
    return largest < Traits::kCanonicalNan ? largest : Traits::kCanonicalNan;
}

// Bit j set iff magnitude_key(values[j]) >= threshold, for one group of kGroup values.
// (Raw sign-masked bits suffice: a NaN's raw key is >= the canonical one, and threshold is a
// canonical key, so the comparison agrees with magnitude_key's.)
template <typename T> uint32_t group_hit_mask(const T* values, KeyOf<T> threshold) {
    uint32_t mask = 0;
    for (int j = 0; j < kGroup; ++j) mask |= uint32_t{magnitude_key(values[j]) >= threshold} << j;
    return mask;
}
#if defined(__AVX512F__)
template <> inline uint32_t group_hit_mask<float>(const float* values, uint32_t threshold) {
    const __m512i bits = _mm512_and_si512(_mm512_loadu_si512(values), _mm512_set1_epi32(0x7FFFFFFF));
    return _mm512_cmpge_epu32_mask(bits, _mm512_set1_epi32(static_cast<int>(threshold)));
}
#elif defined(__AVX2__)
// Sign-masked bits and threshold are below 2^31, so AVX2's signed compare orders them:
// bits >= threshold iff bits > threshold - 1 (-1 for threshold 0).
template <> inline uint32_t group_hit_mask<float>(const float* values, uint32_t threshold) {
    const __m256i magnitude = _mm256_set1_epi32(0x7FFFFFFF);
    const __m256i below = _mm256_set1_epi32(static_cast<int>(threshold) - 1);
    auto hits8 = [&](const float* eight) {
        const __m256i bits = _mm256_and_si256(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(eight)), magnitude);
        return static_cast<uint32_t>(
            _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(bits, below))));
    };
    return hits8(values) | hits8(values + 8) << 8;
}
#endif

// A source of the d values the engine selects from:
//   block(begin, n)   values[begin, begin + n) for the first pass, every block exactly once
//                     (begin a multiple of kBlock; kHasSideEffects: the call may write state)
//   at(i)             values[i] before the first pass
//   group(begin, out) with kSampledInGroups: out[0, kGroup) = values[begin, begin + kGroup)
//                     before the first pass, for the sample's runs (a source whose values cost
//                     more than a read computes them together; the others are read with at)
//   values()          every value, after the first pass
// A source of values read as they are.
template <typename T> struct ReadSource {
    static constexpr bool kHasSideEffects = false;
    static constexpr bool kSampledInGroups = false;
    const T* data;
    const T* block(int64_t begin, int64_t /*n*/) { return data + begin; }
    T at(int64_t i) const { return data[i]; }
    const T* values() const { return data; }
};

// Calls visit(block_begin, block_values, n) for every block of the source, in parallel over
// chunks; visit returns false to stop its chunk early (sources without side effects only).
template <typename Source, typename Visit>
void for_each_block(Source& source, int64_t d, Visit&& visit) {
    const int n_threads = threads_for(d);
#pragma omp parallel num_threads(n_threads)
    {
        const auto [begin, end] = chunk_of(d, omp_get_thread_num(), n_threads);
        for (int64_t b = begin; b < end; b += kBlock) {
            const int64_t n = std::min(kBlock, end - b);
            if (!visit(omp_get_thread_num(), b, source.block(b, n), n) &&
                !Source::kHasSideEffects) {
                break;
            }
        }
    }
}

// Step 2: candidates with key >= threshold, in index order. False if more than cap survived.
template <typename T, typename Index, typename Source>
bool filter_pass(Source& source, int64_t d, KeyOf<T> threshold, int64_t cap,
                 std::vector<Candidate<T, Index>>& candidates) {
    const int n_threads = threads_for(d);
    std::vector<ThreadCandidates<T, Index>> per_thread(n_threads);
    for (auto& mine : per_thread) mine.items.reserve(std::min(cap, d) / (2 * n_threads) + kBlock);
    for_each_block(source, d, [&](int thread, int64_t begin, const T* values, int64_t n) {
        auto& mine = per_thread[thread];
        if (mine.overflow) return false;
        if (block_max_key(values, n) < threshold) return true;
        auto keep = [&](int64_t j) {
            const KeyOf<T> key = magnitude_key(values[j]);
            if (key >= threshold) mine.items.push_back({key, static_cast<Index>(begin + j), values[j]});
        };
        int64_t group = 0;
        for (; group + kGroup <= n; group += kGroup) {
            for (uint32_t hits = group_hit_mask(values + group, threshold); hits; hits &= hits - 1) {
                keep(group + __builtin_ctz(hits));
            }
        }
        for (int64_t j = group; j < n; ++j) keep(j);
        mine.overflow = static_cast<int64_t>(mine.items.size()) > cap;
        return !mine.overflow;
    });
    size_t total = 0;
    for (const auto& mine : per_thread) {
        if (mine.overflow) return false;
        total += mine.items.size();
    }
    candidates.clear();
    if (static_cast<int64_t>(total) > cap) return false;
    candidates.reserve(total);
    for (const auto& mine : per_thread) {
        candidates.insert(candidates.end(), mine.items.begin(), mine.items.end());
    }
    return true;
}

// Step 3: the first n candidates in selection order, written in index order.
template <typename T, typename Index, typename OutIndex>
void finish_exact(const std::vector<Candidate<T, Index>>& candidates, int64_t n,
                  OutIndex* out_index, T* out_value) {
    using C = Candidate<T, Index>;
    if (static_cast<int64_t>(candidates.size()) == n) {
        for (int64_t j = 0; j < n; ++j) {
            out_index[j] = static_cast<OutIndex>(candidates[j].index);
            out_value[j] = candidates[j].value;
        }
        return;
    }
    // The n-th largest key K, and how many entries with key == K are among the first n.
    std::vector<KeyOf<T>> keys(candidates.size());
    for (size_t j = 0; j < candidates.size(); ++j) keys[j] = candidates[j].key;
    std::nth_element(keys.begin(), keys.begin() + (n - 1), keys.end(), std::greater<>());
    const KeyOf<T> kth_key = keys[n - 1];
    const int64_t ties_wanted = 1 + std::count(keys.begin(), keys.begin() + (n - 1), kth_key);
    int64_t written = 0, ties_taken = 0;
    for (const C& c : candidates) {
        if (c.key > kth_key || (c.key == kth_key && ties_taken++ < ties_wanted)) {
            out_index[written] = static_cast<OutIndex>(c.index);
            out_value[written] = c.value;
            ++written;
        }
    }
}

// Step 1 (no hint): the sampled threshold key and the candidate cap it implies.
// False when sampling cannot help (n too large a fraction of d).
template <typename T, typename Source>
bool sampled_threshold(const Source& source, int64_t d, int64_t n, KeyOf<T>& threshold,
                       int64_t& cap) {
    const int64_t runs = std::min(kSampleSize / kGroup, d / kGroup);
    const int64_t s = runs * kGroup;
    const int64_t stride = d / runs;  // >= kGroup
    const double expected = static_cast<double>(n) * s / d;
    const int64_t rank = static_cast<int64_t>(std::ceil(expected + 3.0 * std::sqrt(expected) + 2.0));
    if (rank >= s) return false;
    std::vector<KeyOf<T>> sample(s), run_max(runs, 0);
    auto record = [&](int64_t run, int64_t j, T value) {
        const KeyOf<T> key = magnitude_key(value);
        sample[run * kGroup + j] = key;
        run_max[run] = std::max(run_max[run], key);
    };
    for (int64_t run = 0; run < runs; ++run) {
        if constexpr (Source::kSampledInGroups) {
            T values[kGroup];
            source.group(run * stride, values);
            for (int64_t j = 0; j < kGroup; ++j) record(run, j, values[j]);
        } else {
            for (int64_t j = 0; j < kGroup; ++j) record(run, j, source.at(run * stride + j));
        }
    }
    // The (rank+1)-th largest run maximum is at or below the wanted key (rank + 1 runs hold a
    // key at or above it), so only the sample keys at or above it need ordering.
    if (rank < runs) {
        std::nth_element(run_max.begin(), run_max.begin() + rank, run_max.end(), std::greater<>());
        const KeyOf<T> floor = run_max[rank];
        sample.erase(std::remove_if(sample.begin(), sample.end(),
                                    [floor](KeyOf<T> key) { return key < floor; }),
                     sample.end());
    }
    std::nth_element(sample.begin(), sample.begin() + rank, sample.end(), std::greater<>());
    threshold = sample[rank];
    cap = 2 * (rank + 1) * d / s + 1024;
    return true;
}

// Step 4: exact selection by radix select over the key bits, two or more passes over d.
template <typename T, typename Index, typename OutIndex>
void radix_select(const T* values, int64_t d, int64_t n, OutIndex* out_index, T* out_value) {
    using Key = KeyOf<T>;
    constexpr int kDigitBits = 16;
    constexpr int64_t kBins = int64_t{1} << kDigitBits;
    constexpr int kKeyBits = 8 * sizeof(Key);
    const int n_threads = threads_for(d);

    Key prefix = 0, prefix_mask = 0;
    int64_t rank = n;  // rank of the wanted key among the keys matching prefix, from the top
    std::vector<std::vector<uint32_t>> histograms(n_threads, std::vector<uint32_t>(kBins));
    for (int shift = kKeyBits - kDigitBits; shift >= 0; shift -= kDigitBits) {
        ReadSource<T> source{values};
        for (auto& h : histograms) std::fill(h.begin(), h.end(), 0u);
        for_each_block(source, d, [&](int thread, int64_t, const T* block, int64_t m) {
            uint32_t* h = histograms[thread].data();
            for (int64_t j = 0; j < m; ++j) {
                const Key key = magnitude_key(block[j]);
                if ((key & prefix_mask) == prefix) ++h[(key >> shift) & (kBins - 1)];
            }
            return true;
        });
        int64_t bin = kBins - 1;
        for (;; --bin) {
            int64_t count = 0;
            for (const auto& h : histograms) count += h[bin];
            if (rank <= count) break;
            rank -= count;
        }
        prefix |= static_cast<Key>(bin) << shift;
        prefix_mask |= static_cast<Key>(kBins - 1) << shift;
    }
    const Key kth_key = prefix;
    const int64_t ties_wanted = rank;  // entries with key == kth_key to output, lowest index first

    std::vector<ThreadCandidates<T, Index>> per_thread(n_threads);
    ReadSource<T> source{values};
    for_each_block(source, d, [&](int thread, int64_t begin, const T* block, int64_t m) {
        auto& mine = per_thread[thread];
        for (int64_t j = 0; j < m; ++j) {
            const Key key = magnitude_key(block[j]);
            if (key > kth_key || (key == kth_key && mine.ties++ < ties_wanted)) {
                mine.items.push_back({key, static_cast<Index>(begin + j), block[j]});
            }
        }
        return true;
    });
    int64_t written = 0, ties_taken = 0;
    for (const auto& mine : per_thread) {
        for (const auto& c : mine.items) {
            if (c.key == kth_key && ties_taken++ >= ties_wanted) continue;
            out_index[written] = static_cast<OutIndex>(c.index);
            out_value[written] = c.value;
            ++written;
        }
    }
}

// Top-min(k, d) of the source's values into (out_index, out_value), index order.
// The source's first pass runs over every position exactly once, whatever path is taken.
template <typename T, typename Index, typename OutIndex, typename Source>
int64_t select_topk(Source& source, int64_t d, int64_t k, const T* threshold_hint,
                    OutIndex* out_index, T* out_value) {
    using Key = KeyOf<T>;
    const int64_t n = std::clamp<int64_t>(k, 0, d);
    std::vector<Candidate<T, Index>> candidates;
    const bool guessable = n > 0 && n * kGuessMaxFraction <= d && d > kGuessMinInput;
    bool first_pass_done = false;

    if (n > 0 && !guessable && (n == d || d <= kSmallInput)) {
        filter_pass<T, Index>(source, d, Key{0}, d, candidates);
        finish_exact(candidates, n, out_index, out_value);
        return n;
    }
    if (guessable && threshold_hint != nullptr) {
        first_pass_done = true;
        if (filter_pass<T, Index>(source, d, magnitude_key(*threshold_hint), 4 * n + 1024,
                                  candidates) &&
            static_cast<int64_t>(candidates.size()) >= n) {
            finish_exact(candidates, n, out_index, out_value);
            return n;
        }
    }
    ReadSource<T> reread{source.values()};
    Key threshold;
    int64_t cap;
    if (guessable && (first_pass_done ? sampled_threshold<T>(reread, d, n, threshold, cap)
                                      : sampled_threshold<T>(source, d, n, threshold, cap))) {
        const bool fits = first_pass_done
                              ? filter_pass<T, Index>(reread, d, threshold, cap, candidates)
                              : filter_pass<T, Index>(source, d, threshold, cap, candidates);
        first_pass_done = true;
        if (fits && static_cast<int64_t>(candidates.size()) >= n) {
            finish_exact(candidates, n, out_index, out_value);
            return n;
        }
    }
    if (!first_pass_done && Source::kHasSideEffects) {
        for_each_block(source, d, [](int, int64_t, const T*, int64_t) { return true; });
    }
    if (n > 0) radix_select<T, Index>(source.values(), d, n, out_index, out_value);
    return n;
}

}  // namespace gtopk::cpu::detail
