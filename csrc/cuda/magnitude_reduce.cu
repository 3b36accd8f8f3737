// gtopk::cuda::max_key: the largest magnitude key of x (+ y) by cub::DeviceReduce over a
// transform of the input: one read, no temporary the size of x (torch.isfinite(x).all() makes
// |x| and two masks: 1.75 x the input in temporaries). The non-finite check and the first
// threshold window of MiCRO / ExDyna. mark_nonfinite: the same read, its answer left on the
// device (a flag) instead of brought to the host.
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <type_traits>

#include <cub/device/device_reduce.cuh>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/transform_iterator.h>

#include "cuda_check.cuh"
#include "device.cuh"
#include "gtopk/cuda_ops.h"
#include "gtopk/magnitude_order.h"

namespace gtopk::cuda {
namespace {

using u64 = unsigned long long;

// i -> key(x[i] (+ y[i])); 0 for a non-finite value when finite_only.
template <typename T> struct KeyAt {
    const T* x;
    const T* y;
    bool finite_only;
    __host__ __device__ u64 operator()(int64_t i) const {
        u64 key;
        if constexpr (std::is_floating_point_v<T>) {
            key = magnitude_key(y != nullptr ? T(x[i] + y[i]) : x[i]);
        } else {
            key = magnitude_key(x[i]);
        }
        const u64 first_nonfinite = MagnitudeTraits<T>::kCanonicalNan - 1;  // key of +inf
        return finite_only && key >= first_nonfinite ? 0 : key;
    }
};

struct Larger {
    __host__ __device__ u64 operator()(u64 a, u64 b) const { return a > b ? a : b; }
};

template <typename T> auto keys_of(const T* x, const T* y, bool finite_only) {
    return thrust::make_transform_iterator(thrust::counting_iterator<int64_t>(0),
                                           KeyAt<T>{x, y, finite_only});
}

// Workspace: CUB's temporary storage, then the result.
template <typename T> struct ReduceLayout {
    size_t cub_bytes = 0, temp, result, bytes;
    explicit ReduceLayout(int64_t n) {
        GTOPK_CUDA_CHECK(cub::DeviceReduce::Reduce(
            nullptr, cub_bytes, keys_of<T>(nullptr, nullptr, false), static_cast<u64*>(nullptr),
            n, Larger{}, u64{0}));
        detail::Layout layout;
        temp = layout.add<char>(static_cast<int64_t>(cub_bytes));
        result = layout.add<u64>(1);
        bytes = layout.bytes();
    }
};

template <typename T>
uint64_t max_key_typed(const void* x, const void* y, int64_t n, bool finite_only,
                       cudaStream_t stream, const Workspace& workspace) {
    if constexpr (!std::is_floating_point_v<T>) {
        if (y != nullptr) {
            throw std::invalid_argument("gtopk::cuda::max_key: y must be null for 16-bit values");
        }
    }
    if (n <= 0) return 0;
    const ReduceLayout<T> layout(n);
    u64 largest = 0;
    detail::with_workspace(workspace, layout.bytes, stream, [&](const Workspace& scratch) {
        u64* device_result = detail::piece<u64>(scratch, layout.result);
        size_t cub_bytes = layout.cub_bytes;
        GTOPK_CUDA_CHECK(cub::DeviceReduce::Reduce(
            detail::piece<char>(scratch, layout.temp), cub_bytes,
            keys_of<T>(static_cast<const T*>(x), static_cast<const T*>(y), finite_only),
            device_result, n, Larger{}, u64{0}, stream));
        GTOPK_CUDA_CHECK(cudaMemcpyAsync(&largest, device_result, sizeof(u64),
                                         cudaMemcpyDeviceToHost, stream));
        GTOPK_CUDA_CHECK(cudaStreamSynchronize(stream));
    });
    return largest;
}

// *flag = 1 when the largest key is at or above +Inf's (a NaN's or an Inf's).
template <typename T> __global__ void flag_if_nonfinite(const u64* largest, int32_t* flag) {
    if (*largest >= u64{MagnitudeTraits<T>::kCanonicalNan} - 1) *flag = 1;
}

template <typename T>
void mark_nonfinite_typed(const void* x, int64_t n, int32_t* flag, cudaStream_t stream,
                          const Workspace& workspace) {
    if (n <= 0) return;
    const ReduceLayout<T> layout(n);
    detail::with_workspace(workspace, layout.bytes, stream, [&](const Workspace& scratch) {
        u64* device_result = detail::piece<u64>(scratch, layout.result);
        size_t cub_bytes = layout.cub_bytes;
        GTOPK_CUDA_CHECK(cub::DeviceReduce::Reduce(
            detail::piece<char>(scratch, layout.temp), cub_bytes,
            keys_of<T>(static_cast<const T*>(x), nullptr, false), device_result, n, Larger{},
            u64{0}, stream));
        flag_if_nonfinite<T><<<1, 1, 0, stream>>>(device_result, flag);
        GTOPK_CUDA_CHECK(cudaGetLastError());
    });
}

template <typename Body> auto with_value_type(ValueType value_type, Body&& body) {
    switch (value_type) {
        case ValueType::kFloat32: return body(float{});
        case ValueType::kFloat64: return body(double{});
        case ValueType::kFloat16: return body(float16_bits{});
        case ValueType::kBFloat16: return body(bfloat16_bits{});
    }
    throw std::invalid_argument("gtopk::cuda::max_key: unsupported value type");
}

}  // namespace

size_t max_key_workspace_bytes(ValueType value_type, int64_t n) {
    if (n <= 0) return 0;
    return with_value_type(value_type,
                           [&](auto v) { return ReduceLayout<decltype(v)>(n).bytes; });
}

uint64_t max_key(ValueType value_type, const void* x, const void* y, int64_t n, bool finite_only,
                 void* stream, Workspace workspace) {
    const auto s = static_cast<cudaStream_t>(stream);
    return with_value_type(value_type, [&](auto v) {
        return max_key_typed<decltype(v)>(x, y, n, finite_only, s, workspace);
    });
}

void mark_nonfinite(ValueType value_type, const void* x, int64_t n, int32_t* flag, void* stream,
                    Workspace workspace) {
    const auto s = static_cast<cudaStream_t>(stream);
    with_value_type(value_type, [&](auto v) {
        mark_nonfinite_typed<decltype(v)>(x, n, flag, s, workspace);
    });
}

}  // namespace gtopk::cuda
