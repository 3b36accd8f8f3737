// Per-device state of the CUDA kernels, kept for the life of the process: attributes that the
// launches need, and the workspace used when the caller passes none.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>

#include "cuda_check.cuh"
#include "gtopk/cuda_ops.h"

namespace gtopk::cuda::detail {

int current_device();
// Queried once per device: its SM count, its L2 cache's bytes, and how many blocks of `threads` threads of `kernel`
// an SM holds (`device` must be the current device).
int sm_count(int device);
int l2_bytes(int device);
int max_blocks_per_sm(const void* kernel, int threads, int device);

// The cached workspace of one device: whoever holds `mutex` may use [data, data + bytes) on its
// stream once that stream waits for `released`, recorded after the previous holder's work.
struct DeviceWorkspace {
    std::mutex mutex;
    void* data = nullptr;
    size_t bytes = 0;
    cudaEvent_t released = nullptr;
};

// Holds the current device's cached workspace, grown to at least `bytes`, for work on `stream`.
class WorkspaceLease {
public:
    WorkspaceLease(size_t bytes, cudaStream_t stream);
    WorkspaceLease(const WorkspaceLease&) = delete;
    WorkspaceLease& operator=(const WorkspaceLease&) = delete;
    ~WorkspaceLease();
    Workspace workspace() const { return {cache_->data, cache_->bytes}; }
    // Marks the end of the work enqueued with the workspace; call once that is all enqueued.
    void release();

private:
    DeviceWorkspace* cache_;
    std::unique_lock<std::mutex> lock_;
    cudaStream_t stream_;
    bool released_ = false;
};

constexpr size_t kWorkspaceAlignment = 256;

// Calls body(workspace) with the caller's workspace, checked to hold `bytes`, or else with the
// current device's cached one. Nothing is taken when no scratch is needed.
template <typename Body>
void with_workspace(const Workspace& given, size_t bytes, cudaStream_t stream, Body&& body) {
    if (bytes == 0) {
        body(Workspace{});
    } else if (given.data != nullptr) {
        if (given.bytes < bytes) {
            throw std::invalid_argument("gtopk: the workspace holds " +
                                        std::to_string(given.bytes) + " bytes, " +
                                        std::to_string(bytes) + " are needed");
        }
        if (reinterpret_cast<uintptr_t>(given.data) % kWorkspaceAlignment != 0) {
            throw std::invalid_argument("gtopk: the workspace must be 256-byte aligned");
        }
        body(given);
    } else {
        WorkspaceLease lease(bytes, stream);
        body(lease.workspace());
        lease.release();
    }
}

// Offsets of scratch pieces in a workspace, each aligned to kWorkspaceAlignment.
class Layout {
public:
    template <typename U> size_t add(int64_t count) {
        const size_t offset = aligned(bytes_);
        bytes_ = offset + static_cast<size_t>(count) * sizeof(U);
        return offset;
    }
    size_t bytes() const { return bytes_; }
    static size_t aligned(size_t n) {
        return (n + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment;
    }

private:
    size_t bytes_ = 0;
};

template <typename U> U* piece(const Workspace& workspace, size_t offset) {
    return reinterpret_cast<U*>(static_cast<char*>(workspace.data) + offset);
}

}  // namespace gtopk::cuda::detail
