// The magnitude histogram of the threshold selection pass (cpu::accumulate_threshold,
// cuda::accumulate_count), one rule for the CPU and the CUDA kernels.
//
// Keys are magnitude_key's (magnitude_order.h). A key at or above `base`, with offset
// o = key - base, falls in
//     bin(o) = o >> fine_shift                                   for o < n_fine << fine_shift
//              n_fine + ((o - (n_fine << fine_shift)) >> coarse_shift)     otherwise
// capped at n_bins - 1 (the last bin is open above). n_fine outside [0, n_bins] means n_bins:
// every bin is a fine one. Keys below base are not counted.
#pragma once

#include <cstdint>

#include "gtopk/magnitude_order.h"

namespace gtopk {

template <typename Key> struct HistogramBins {
    Key base;
    int fine_shift;
    int coarse_shift;
    int64_t n_fine;  // in [0, n_bins]
    int64_t n_bins;  // >= 1

    static HistogramBins make(Key base, int fine_shift, int64_t n_bins, int64_t n_fine,
                              int coarse_shift) {
        if (n_fine < 0 || n_fine > n_bins) n_fine = n_bins;
        return {base, fine_shift, coarse_shift, n_fine, n_bins};
    }

    // The bin of a key >= base.
    GTOPK_HOST_DEVICE int64_t of(Key key) const {
        const uint64_t offset = static_cast<uint64_t>(key - base);
        const uint64_t fine_span = static_cast<uint64_t>(n_fine) << fine_shift;
        if (offset < fine_span) return static_cast<int64_t>(offset >> fine_shift);  // < n_fine
        const int64_t room = n_bins - 1 - n_fine;  // coarse bins below the open last one
        if (room <= 0) return n_bins - 1;
        const uint64_t coarse = (offset - fine_span) >> coarse_shift;
        return coarse >= static_cast<uint64_t>(room) ? n_bins - 1
                                                     : n_fine + static_cast<int64_t>(coarse);
    }
};

}  // namespace gtopk
