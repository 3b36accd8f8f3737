// Turns CUDA runtime failures into std::runtime_error naming the failing call.
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace gtopk::cuda::detail {

inline void check_cuda(cudaError_t status, const char* call, const char* file, int line) {
    if (status != cudaSuccess) {
        throw std::runtime_error(std::string(call) + " failed at " + file + ":" +
                                 std::to_string(line) + ": " + cudaGetErrorString(status));
    }
}

}  // namespace gtopk::cuda::detail

#define GTOPK_CUDA_CHECK(call) ::gtopk::cuda::detail::check_cuda((call), #call, __FILE__, __LINE__)

// Checks the launch of the kernel just enqueued (configuration errors surface here; faults in
// the kernel itself surface at the next synchronising call).
#define GTOPK_CUDA_CHECK_LAUNCH(kernel_name)                                                \
    ::gtopk::cuda::detail::check_cuda(cudaGetLastError(), "launch of " kernel_name, __FILE__, \
                                      __LINE__)
