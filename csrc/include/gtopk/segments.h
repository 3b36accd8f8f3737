// Segments of one flat vector, for the segmented selections (cpu::segmented_accumulate_select,
// cuda::segmented_accumulate_select) and the table that describes them.
//
// S segments over a vector of d values: offsets[0] = 0 <= offsets[1] <= ... <= offsets[S] = d,
// segment s = [offsets[s], offsets[s + 1]), of length len_s; ks[s] >= 0 its budget. Segment s
// selects n_s = min(ks[s], len_s) entries; they are written at out_offsets[s] = n_0 + ... +
// n_{s-1} of the outputs, which hold out_offsets[S] entries in all.
//
// The table (segment_table) is 3 rows of S + 1 int64, row-major:
//   row 0: offsets;
//   row 1: out_offsets (out_offsets[S] = the number of entries selected);
//   row 2: chunk_offsets, the prefix sums of ceil(len_s / kSegmentChunk): the CUDA passes give
//          each block one chunk of kSegmentChunk entries of one segment.
// It depends on the segments only, so a caller builds it once and keeps a copy on the device.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace gtopk {

constexpr int64_t kSegmentChunk = int64_t{1} << 15;
constexpr int kSegmentTableRows = 3;

// Throws std::invalid_argument unless offsets (segments + 1 values) and ks (segments values)
// describe segments of a vector of d values as above.
inline void check_segments(const int64_t* offsets, const int64_t* ks, int64_t segments,
                           int64_t d) {
    if (segments < 0) throw std::invalid_argument("gtopk: a negative number of segments");
    if (offsets[0] != 0 || offsets[segments] != d) {
        throw std::invalid_argument("gtopk: segment offsets must start at 0 and end at d = " +
                                    std::to_string(d) + ", got " + std::to_string(offsets[0]) +
                                    " .. " + std::to_string(offsets[segments]));
    }
    for (int64_t s = 0; s < segments; ++s) {
        if (offsets[s + 1] < offsets[s]) {
            throw std::invalid_argument("gtopk: segment offsets must not decrease (segment " +
                                        std::to_string(s) + ")");
        }
        if (ks[s] < 0) {
            throw std::invalid_argument("gtopk: segment " + std::to_string(s) +
                                        " has k < 0");
        }
    }
}

// The table above, for segments already checked by check_segments.
inline std::vector<int64_t> segment_table(const int64_t* offsets, const int64_t* ks,
                                          int64_t segments) {
    const int64_t row = segments + 1;
    std::vector<int64_t> table(kSegmentTableRows * row, 0);
    for (int64_t s = 0; s <= segments; ++s) table[s] = offsets[s];
    for (int64_t s = 0; s < segments; ++s) {
        const int64_t length = offsets[s + 1] - offsets[s];
        const int64_t n = ks[s] < length ? ks[s] : length;
        table[row + s + 1] = table[row + s] + n;
        table[2 * row + s + 1] =
            table[2 * row + s] + (length + kSegmentChunk - 1) / kSegmentChunk;
    }
    return table;
}

}  // namespace gtopk
