// Threshold selection fused with the error-feedback accumulation (MiCRO / ExDyna's pass).
#include <algorithm>
#include <vector>

#include "gtopk/cpu_ops.h"
#include "select_engine.h"

namespace gtopk::cpu {

template <typename T, typename Index>
void accumulate_threshold(T* gradient, T* residual, int64_t d, int64_t begin, int64_t end,
                          MagnitudeKey<T> threshold, MagnitudeKey<T> histogram_base,
                          int histogram_shift, int64_t n_bins, int64_t* histogram,
                          bool clear_gradient, std::vector<Index>& out_index) {
    using Key = MagnitudeKey<T>;
    const int n_threads = detail::threads_for(d);
    std::vector<std::vector<Index>> selected(n_threads);
    std::vector<std::vector<int64_t>> counts(n_threads, std::vector<int64_t>(n_bins, 0));
#pragma omp parallel num_threads(n_threads)
    {
        const int thread = omp_get_thread_num();
        const auto [first, last] = detail::chunk_of(d, thread, n_threads);
        auto& mine = selected[thread];
        int64_t* bins = counts[thread].data();
        auto visit = [&](int64_t i) {  // |residual[i]| >= the histogram's lowest edge
            const Key key = magnitude_key(residual[i]);
            bins[std::min<int64_t>((key - histogram_base) >> histogram_shift, n_bins - 1)]++;
            if (key >= threshold) mine.push_back(static_cast<Index>(i));
        };
        for (int64_t b = first; b < last; b += detail::kBlock) {
            const int64_t n = std::min(detail::kBlock, last - b);
            T* r = residual + b;
            T* g = gradient + b;
            for (int64_t j = 0; j < n; ++j) r[j] += g[j];
            if (clear_gradient) std::fill(g, g + n, T(0));
            const int64_t lo = std::max(b, begin), hi = std::min(b + n, end);
            if (lo >= hi || detail::block_max_key(residual + lo, hi - lo) < histogram_base) continue;
            int64_t i = lo;
            for (; i + detail::kGroup <= hi; i += detail::kGroup) {
                for (uint32_t hits = detail::group_hit_mask(residual + i, histogram_base); hits;
                     hits &= hits - 1) {
                    visit(i + __builtin_ctz(hits));
                }
            }
            for (; i < hi; ++i) {
                if (magnitude_key(residual[i]) >= histogram_base) visit(i);
            }
        }
    }
    std::fill(histogram, histogram + n_bins, 0);
    size_t total = 0;
    for (int t = 0; t < n_threads; ++t) {
        total += selected[t].size();
        for (int64_t b = 0; b < n_bins; ++b) histogram[b] += counts[t][b];
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
                                                 int64_t*, bool, std::vector<Index>&); \
    template void threshold_indices<T, Index>(const T*, int64_t, int64_t, MagnitudeKey<T>,       \
                                              std::vector<Index>&);
GTOPK_INSTANTIATE(float, int32_t)
GTOPK_INSTANTIATE(float, int64_t)
GTOPK_INSTANTIATE(double, int32_t)
GTOPK_INSTANTIATE(double, int64_t)
#undef GTOPK_INSTANTIATE

}  // namespace gtopk::cpu
