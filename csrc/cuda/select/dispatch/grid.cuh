// Host side: the grid sizes of the engine's launches.
#pragma once

#include <algorithm>
#include <cstdint>

#include "../../device.cuh"
#include "../tuning.cuh"

namespace gtopk::cuda::detail {

inline int64_t blocks_for(int64_t count, int64_t per_block) {
    return std::max<int64_t>(1, (count + per_block - 1) / per_block);
}

// Grid of a tile-looping kernel: every SM full, never more blocks than tiles, and never more
// than 2^30 entries per block (its shared-memory counters are 32-bit).
template <typename T, typename Kernel>
int tile_grid(Kernel kernel, int64_t count) {
    const int device = current_device();
    const int sms = sm_count(device);
    const int per_sm = max_blocks_per_sm(reinterpret_cast<const void*>(kernel), kThreads, device);
    const int64_t resident = int64_t{std::max(sms, 1)} * std::max(per_sm, 1);
    const int64_t wanted = std::max(resident, blocks_for(count, int64_t{1} << 30));
    return static_cast<int>(std::min(wanted, blocks_for(count, kTile<T>)));
}

}  // namespace gtopk::cuda::detail
