// Threshold selection fused with the error-feedback accumulation (MiCRO / ExDyna's pass).
#include <algorithm>
#include <type_traits>
#include <vector>

#include "gtopk/cpu_ops.h"
#include "gtopk/histogram_bins.h"
#include "select_engine.h"

namespace gtopk::cpu {

namespace {

// Keys (magnitude_key) and positions of the values in x[0..n) whose key is >= base, in order;
// returns how many. n <= detail::kBlock; keys and positions hold kBlock + 16 entries.
template <typename T>
int64_t gather_hits(const T* x, int64_t n, MagnitudeKey<T> base, MagnitudeKey<T>* keys,
                    int32_t* positions) {
    int64_t count = 0, j = 0;
#if defined(__AVX512F__)
    if constexpr (std::is_same_v<T, float>) {
        const __m512i magnitude = _mm512_set1_epi32(0x7FFFFFFF);
        const __m512i nan = _mm512_set1_epi32(static_cast<int>(MagnitudeTraits<float>::kCanonicalNan));
        const __m512i floor = _mm512_set1_epi32(static_cast<int>(base));
        __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        const __m512i step = _mm512_set1_epi32(16);
        for (; j + 16 <= n; j += 16) {
            __m512i key = _mm512_and_si512(_mm512_loadu_si512(x + j), magnitude);
            key = _mm512_min_epu32(key, nan);
            const __mmask16 hit = _mm512_cmpge_epu32_mask(key, floor);
            if (hit) {  // compress in registers, store whole vectors (buffers have slack):
                        // a compressing store to memory is microcoded on some CPUs
                _mm512_storeu_si512(keys + count, _mm512_maskz_compress_epi32(hit, key));
                _mm512_storeu_si512(positions + count, _mm512_maskz_compress_epi32(hit, lanes));
                count += __builtin_popcount(hit);
            }
            lanes = _mm512_add_epi32(lanes, step);
        }
    }
#endif
    for (; j < n; ++j) {
        const MagnitudeKey<T> key = magnitude_key(x[j]);
        if (key >= base) {
            keys[count] = key;
            positions[count++] = static_cast<int32_t>(j);
        }
    }
    return count;
}

constexpr int kHistogramCopies = 4;  // interleaved, so repeated bins do not chain increments

}  // namespace

template <typename T, typename Index>
void accumulate_threshold(T* gradient, T* residual, int64_t d, int64_t begin, int64_t end,
                          MagnitudeKey<T> threshold, MagnitudeKey<T> histogram_base,
                          int histogram_shift, int64_t n_bins, int64_t* histogram,
                          bool clear_gradient, std::vector<Index>& out_index, int64_t n_fine,
                          int coarse_shift) {
    using Key = MagnitudeKey<T>;
    const auto bins_of = HistogramBins<Key>::make(histogram_base, histogram_shift, n_bins, n_fine,
                                                  coarse_shift);
    const int n_threads = detail::threads_for(d);
    std::vector<std::vector<Index>> selected(n_threads);
    std::vector<std::vector<int64_t>> counts(
        n_threads, std::vector<int64_t>(kHistogramCopies * n_bins, 0));
#pragma omp parallel num_threads(n_threads)
    {
        const int thread = omp_get_thread_num();
        const auto [first, last] = detail::chunk_of(d, thread, n_threads);
        auto& mine = selected[thread];
        int64_t* bins = counts[thread].data();
        alignas(64) Key keys[detail::kBlock + 16];
        alignas(64) int32_t positions[detail::kBlock + 16];
        for (int64_t b = first; b < last; b += detail::kBlock) {
            const int64_t n = std::min(detail::kBlock, last - b);
            if (gradient != nullptr) {
                T* r = residual + b;
                T* g = gradient + b;
                for (int64_t j = 0; j < n; ++j) r[j] += g[j];
                if (clear_gradient) std::fill(g, g + n, T(0));
            }
            const int64_t lo = std::max(b, begin), hi = std::min(b + n, end);
            if (lo >= hi || detail::block_max_key(residual + lo, hi - lo) < histogram_base) continue;
            const int64_t hits = gather_hits(residual + lo, hi - lo, histogram_base, keys, positions);
            for (int64_t j = 0; j < hits; ++j) {
                bins[(j % kHistogramCopies) * n_bins + bins_of.of(keys[j])]++;
            }
            for (int64_t j = 0; j < hits; ++j) {
                if (keys[j] >= threshold) mine.push_back(static_cast<Index>(lo + positions[j]));
            }
        }
    }
    std::fill(histogram, histogram + n_bins, 0);
    size_t total = 0;
    for (int t = 0; t < n_threads; ++t) {
        total += selected[t].size();
        for (int c = 0; c < kHistogramCopies; ++c) {
            for (int64_t b = 0; b < n_bins; ++b) histogram[b] += counts[t][c * n_bins + b];
        }
    }
    out_index.clear();
    out_index.reserve(total);
    for (const auto& part : selected) out_index.insert(out_index.end(), part.begin(), part.end());
}

template <typename T, typename Index>
void threshold_indices(const T* x, int64_t begin, int64_t end, MagnitudeKey<T> threshold,
                       std::vector<Index>& out_index) {
    const int64_t n = end - begin;
    const int n_threads = detail::threads_for(n);
    std::vector<std::vector<Index>> selected(n_threads);
#pragma omp parallel num_threads(n_threads)
    {
        const int thread = omp_get_thread_num();
        const auto [first, last] = detail::chunk_of(n, thread, n_threads);
        auto& mine = selected[thread];
        for (int64_t b = begin + first; b < begin + last; b += detail::kBlock) {
            const int64_t hi = std::min(b + detail::kBlock, begin + last);
            if (detail::block_max_key(x + b, hi - b) < threshold) continue;
            int64_t i = b;
            for (; i + detail::kGroup <= hi; i += detail::kGroup) {
                for (uint32_t hits = detail::group_hit_mask(x + i, threshold); hits;
                     hits &= hits - 1) {
                    mine.push_back(static_cast<Index>(i + __builtin_ctz(hits)));
                }
            }
            for (; i < hi; ++i) {
                if (magnitude_key(x[i]) >= threshold) mine.push_back(static_cast<Index>(i));
            }
        }
    }
    out_index.clear();
    for (const auto& part : selected) out_index.insert(out_index.end(), part.begin(), part.end());
}

#define GTOPK_INSTANTIATE(T, Index)                                                            \
    template void accumulate_threshold<T, Index>(T*, T*, int64_t, int64_t, int64_t,           \
                                                 MagnitudeKey<T>, MagnitudeKey<T>, int, int64_t, \
                                                 int64_t*, bool, std::vector<Index>&, int64_t, \
                                                 int); \
    template void threshold_indices<T, Index>(const T*, int64_t, int64_t, MagnitudeKey<T>,       \
                                              std::vector<Index>&);
GTOPK_INSTANTIATE(float, int32_t)
GTOPK_INSTANTIATE(float, int64_t)
GTOPK_INSTANTIATE(double, int32_t)
GTOPK_INSTANTIATE(double, int64_t)
#undef GTOPK_INSTANTIATE

}  // namespace gtopk::cpu
