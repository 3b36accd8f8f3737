// momentum_update (gtopk/cuda_ops.h): momentum correction's velocity update in one pass.
//
//   velocity[i] = momentum * velocity[i] + gradient[i] / divisor
//
// Each operation is rounded on its own (a product, a quotient, a sum: the _rn intrinsics keep
// nvcc from contracting them into a fused multiply-add), as the host's two whole-array passes
// (velocity *= momentum, then velocity += gradient / divisor) round them: equal bit for bit.
// Traffic: one read of each array and one write of the velocity, against two reads and two
// writes of the velocity in the two passes. A set skip flag (device memory) leaves it as it is.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>

#include "cuda_check.cuh"
#include "gtopk/cuda_ops.h"

namespace gtopk::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = int64_t{1} << 16;

__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float div_rn(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ double div_rn(double a, double b) { return __ddiv_rn(a, b); }
__device__ __forceinline__ float add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double add_rn(double a, double b) { return __dadd_rn(a, b); }

// A thread loads kBatch entries of both arrays before it writes any: a store between two loads
// that may alias it would hold the later load behind the earlier one's round trip.
constexpr int kBatch = 8;

template <typename T>
__global__ void __launch_bounds__(kThreads) momentum_kernel(T* velocity, const T* gradient,
                                                            int64_t n, T momentum, T divisor,
                                                            bool divide, const int32_t* skip) {
    if (skip != nullptr && *skip != 0) return;
    const int64_t stride = int64_t{gridDim.x} * kThreads;
    for (int64_t first = blockIdx.x * int64_t{kThreads} + threadIdx.x; first < n;
         first += kBatch * stride) {
        T v[kBatch], g[kBatch];
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
            const int64_t i = first + b * stride;
            v[b] = i < n ? velocity[i] : T(0);
            g[b] = i < n ? gradient[i] : T(0);
        }
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
            const int64_t i = first + b * stride;
            if (i >= n) continue;
            const T step = divide ? div_rn(g[b], divisor) : g[b];
            velocity[i] = add_rn(mul_rn(v[b], momentum), step);
        }
    }
}

template <typename T>
void momentum_typed(void* velocity, const void* gradient, int64_t n, double momentum,
                    double divisor, cudaStream_t stream, const int32_t* skip) {
    const int64_t per_block = int64_t{kThreads} * kBatch;
    const int blocks = static_cast<int>(std::min(kMaxBlocks, (n + per_block - 1) / per_block));
    momentum_kernel<T><<<blocks, kThreads, 0, stream>>>(
        static_cast<T*>(velocity), static_cast<const T*>(gradient), n, static_cast<T>(momentum),
        static_cast<T>(divisor), divisor != 1.0, skip);
    GTOPK_CUDA_CHECK_LAUNCH("momentum_kernel");
}

}  // namespace

void momentum_update(ValueType value_type, void* velocity, const void* gradient, int64_t n,
                     double momentum, double divisor, void* stream, const int32_t* skip) {
    if (n <= 0) return;
    const auto s = static_cast<cudaStream_t>(stream);
    switch (value_type) {
        case ValueType::kFloat32:
            return momentum_typed<float>(velocity, gradient, n, momentum, divisor, s, skip);
        case ValueType::kFloat64:
            return momentum_typed<double>(velocity, gradient, n, momentum, divisor, s, skip);
        default:
            break;
    }
    throw std::invalid_argument(
        "gtopk::cuda::momentum_update: only float32 and float64 values are supported");
}

}  // namespace gtopk::cuda
