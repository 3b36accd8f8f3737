// Device side: the last block of a pass (arrive_last) and the state as every block left it.
//
// A pass whose blocks all add to one histogram ends in its last block, which acts on the total
// (guesses the first bin, chooses the bin of a level): each block, once its writes are done,
// fences them and counts itself in state->arrivals; the block that counts last resets the count
// and reads the others' results through L2. This saves a one-block kernel launch per level.
#pragma once

#include "gtopk/select_engine.cuh"

namespace gtopk::cuda::detail {

// True in every thread of the block that arrives last. Call with every thread, after the
// block's writes to global memory.
__device__ __forceinline__ bool arrive_last(unsigned* arrivals) {
    __shared__ bool is_last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        is_last = atomicAdd(arrivals, 1u) == gridDim.x - 1;
        if (is_last) __threadfence();
    }
    __syncthreads();
    return is_last;
}

// The state as the other blocks of this kernel left it (read through L2).
__device__ __forceinline__ SelectState load_state(const SelectState* state) {
    static_assert(sizeof(SelectState) % sizeof(u64) == 0 && alignof(SelectState) == alignof(u64),
                  "SelectState is read as 64-bit words");
    constexpr int kWords = sizeof(SelectState) / sizeof(u64);
    u64 words[kWords];
    const u64* from = reinterpret_cast<const u64*>(state);
#pragma unroll
    for (int w = 0; w < kWords; ++w) words[w] = __ldcg(from + w);
    SelectState s;
    memcpy(&s, words, sizeof(s));
    return s;
}

}  // namespace gtopk::cuda::detail
