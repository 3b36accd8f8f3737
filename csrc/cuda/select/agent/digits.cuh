// Device side: where an entry stands against the state's prefix, and its digit at a level
// (gtopk/select_engine.cuh's Level and SelectState).
#pragma once

#include "gtopk/select_engine.cuh"

namespace gtopk::cuda::detail {

// +1: the entry comes before every entry matching the prefix, 0: it matches, -1: after.
__device__ __forceinline__ int locate(const SelectState& s, u64 key, u64 inv) {
    const u64 k = key & s.key_mask;
    if (k != s.key_prefix) return k > s.key_prefix ? 1 : -1;
    const u64 v = inv & s.inv_mask;
    if (v != s.inv_prefix) return v > s.inv_prefix ? 1 : -1;
    return 0;
}

// True when the prefix already fixes every bit of the level's digit.
__device__ __forceinline__ bool level_fixed(const SelectState& s, const Level& level) {
    const u64 mask = ((u64{1} << level.bits) - 1) << level.shift;
    return ((level.on_key ? s.key_mask : s.inv_mask) & mask) == mask;
}

__device__ __forceinline__ unsigned digit_of(const Level& level, u64 key, u64 inv) {
    const u64 v = level.on_key ? key : inv;
    return static_cast<unsigned>((v >> level.shift) & ((u64{1} << level.bits) - 1));
}

}  // namespace gtopk::cuda::detail
