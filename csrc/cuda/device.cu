// Per-device caches of the CUDA kernels (device.cuh). They live until the process exits: the
// cached workspaces are never freed (the driver releases them at exit).
#include "device.cuh"

#include <map>
#include <memory>
#include <tuple>

namespace gtopk::cuda::detail {
namespace {

std::mutex attributes_mutex;
std::map<int, int> sm_counts;
std::map<int, int> l2_sizes;
std::map<std::tuple<const void*, int, int>, int> occupancy;  // (kernel, threads, device)

}  // namespace

int current_device() {
    int device = 0;
    GTOPK_CUDA_CHECK(cudaGetDevice(&device));
    return device;
}

int sm_count(int device) {
    std::lock_guard<std::mutex> lock(attributes_mutex);
    auto found = sm_counts.find(device);
    if (found == sm_counts.end()) {
        int sms = 0;
        GTOPK_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
        found = sm_counts.emplace(device, sms).first;
    }
    return found->second;
}

int l2_bytes(int device) {
    std::lock_guard<std::mutex> lock(attributes_mutex);
    auto found = l2_sizes.find(device);
    if (found == l2_sizes.end()) {
        int bytes = 0;
        GTOPK_CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrL2CacheSize, device));
        found = l2_sizes.emplace(device, bytes).first;
    }
    return found->second;
}

int max_blocks_per_sm(const void* kernel, int threads, int device) {
    std::lock_guard<std::mutex> lock(attributes_mutex);
    const auto key = std::make_tuple(kernel, threads, device);
    auto found = occupancy.find(key);
    if (found == occupancy.end()) {
        int blocks = 0;
        GTOPK_CUDA_CHECK(
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, 0));
        found = occupancy.emplace(key, blocks).first;
    }
    return found->second;
}

namespace {

DeviceWorkspace& device_workspace(int device) {
    static std::mutex mutex;
    // Never destroyed: a workspace may be in use by another thread while the process exits.
    static auto* caches = new std::map<int, std::unique_ptr<DeviceWorkspace>>();
    std::lock_guard<std::mutex> lock(mutex);
    auto& cache = (*caches)[device];
    if (!cache) cache = std::make_unique<DeviceWorkspace>();
    return *cache;
}

}  // namespace

WorkspaceLease::WorkspaceLease(size_t bytes, cudaStream_t stream)
    : cache_(&device_workspace(current_device())), lock_(cache_->mutex), stream_(stream) {
    if (cache_->released == nullptr) {
        GTOPK_CUDA_CHECK(cudaEventCreateWithFlags(&cache_->released, cudaEventDisableTiming));
    }
    GTOPK_CUDA_CHECK(cudaStreamWaitEvent(stream_, cache_->released, 0));
    if (cache_->bytes < bytes) {
        if (cache_->data != nullptr) {
            GTOPK_CUDA_CHECK(cudaFreeAsync(cache_->data, stream_));
            cache_->data = nullptr;
            cache_->bytes = 0;
        }
        GTOPK_CUDA_CHECK(cudaMallocAsync(&cache_->data, bytes, stream_));
        cache_->bytes = bytes;
    }
}

void WorkspaceLease::release() {
    GTOPK_CUDA_CHECK(cudaEventRecord(cache_->released, stream_));
    released_ = true;
}

WorkspaceLease::~WorkspaceLease() {
    if (released_) return;
    // Unwinding from an error, with work that may use the workspace possibly enqueued: if its end
    // cannot be recorded, the workspace is abandoned (neither reused nor freed).
    if (cudaEventRecord(cache_->released, stream_) != cudaSuccess) {
        cache_->data = nullptr;
        cache_->bytes = 0;
    }
}

}  // namespace gtopk::cuda::detail
