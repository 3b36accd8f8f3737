// The magnitude histogram of the threshold selection pass (cpu::accumulate_threshold,
// cuda::accumulate_count), one rule for the CPU and the CUDA kernels.
//
// Keys are magnitude_key's (magnitude_order.h). A key at or above `base`, with offset
// o = key - base, falls in
//     bin(o) = o >> fine_shift                                   for o < n_fine << fine_shift
//              n_fine + ((o - (n_fine << fine_shift)) >> coarse_shift)     otherwise
// capped at n_bins - 1 (the last bin is open above). n_fine < 0 means n_bins: every bin is a
// fine one (n_fine > n_bins is refused: check_histogram_arguments). Keys below base are not
// counted.
#pragma once

#include <cstdint>
#include <limits>
#include <stdexcept>

#include "gtopk/magnitude_order.h"

namespace gtopk {

template <typename Key> struct HistogramBins {
    Key base;
    int fine_shift;
    int coarse_shift;
    int64_t n_fine;  // in [0, n_bins]
    int64_t n_bins;  // >= 1

    // The arguments in the order the kernels take them (n_fine < 0: n_bins).
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

// The arguments of the threshold pass that the CPU and CUDA kernels both refuse, as
// std::invalid_argument (a ValueError in Python).

// n_bins >= 1, n_fine <= n_bins, shifts in [0, 52], and the fine bins' span
// ((n_fine < 0 ? n_bins : n_fine) << fine_shift) below 2^63.
inline void check_histogram_arguments(int64_t n_bins, int64_t n_fine, int fine_shift,
                                      int coarse_shift) {
    if (n_bins < 1 || n_fine > n_bins || fine_shift < 0 || fine_shift > 52 || coarse_shift < 0 ||
        coarse_shift > 52) {
        throw std::invalid_argument("need n_bins >= 1, n_fine <= n_bins and shifts in [0, 52]");
    }
    const int64_t fine = n_fine < 0 ? n_bins : n_fine;
    if (fine > (std::numeric_limits<int64_t>::max() >> fine_shift)) {
        throw std::invalid_argument(
            "the fine bins span 2^63 keys or more (n_fine << histogram_shift)");
    }
}

// Keys arrive as 64 bits; each must be a key of Key's width (a wider one would be truncated to
// another key).
template <typename Key, typename... Keys> void check_keys_fit(Keys... keys) {
    if (((static_cast<uint64_t>(keys) > std::numeric_limits<Key>::max()) || ...)) {
        throw std::invalid_argument("a threshold or histogram key does not fit the values' key "
                                    "type (float32 keys are below 2^32)");
    }
}

}  // namespace gtopk
