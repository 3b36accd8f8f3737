// gtopk::cuda::sketch_table and sketch_estimate: the count sketch of sketched SGD on the GPU,
// with the hashes, integer sums and median of gtopk/count_sketch.h, so that the table and the
// estimates equal the CPU kernels' bit for bit.
//
// sketch_table, three kernels and no synchronisation:
//   1. one pass over d: residual += gradient (gradient = 0 when clearing), and the largest
//      finite magnitude key and the largest key (a warp max, then one atomicMax per warp);
//   2. one read of d: each entry's q(i) added to the rows x columns int64 sums with 64-bit
//      integer atomics (integer adds commute: the order of the atomics does not matter), the
//      scale read from kernel 1's result on the device; non-finite entries OR their flag in;
//   3. over the table: S[j, b] from its sum and flags.
// sketch_estimate: one pass over d writing est(i) (rows gathers from the table per entry).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "cuda_check.cuh"
#include "device.cuh"
#include "gtopk/count_sketch.h"
#include "gtopk/cuda_ops.h"
#include "select_engine.cuh"

namespace gtopk::cuda {
namespace {

using detail::kThreads;
using detail::u64;

// The keys and shape of a table, passed by value (512 bytes of keys at most).
struct SketchShape {
    uint32_t keys[2 * sketch::kMaxRows];
    int rows;
    int64_t columns;
};

SketchShape shape_of(const uint32_t* keys, int rows, int64_t columns, const char* what) {
    if (rows < 1 || rows > sketch::kMaxRows || columns < 1 || columns > sketch::kMaxColumns) {
        throw std::invalid_argument(std::string("gtopk::cuda::") + what + ": need 1 <= rows <= " +
                                    std::to_string(sketch::kMaxRows) +
                                    " and 1 <= columns < 2^32, got " +
                                    std::to_string(rows) + " x " + std::to_string(columns));
    }
    SketchShape shape{};
    std::copy(keys, keys + 2 * rows, shape.keys);
    shape.rows = rows;
    shape.columns = columns;
    return shape;
}

// extremes[0] = largest finite magnitude key, extremes[1] = largest key.
__global__ void __launch_bounds__(kThreads)
accumulate_extremes_kernel(float* gradient, float* residual, int64_t d, bool clear_gradient,
                           unsigned int* extremes) {
    unsigned int max_finite = 0, max_key = 0;
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < d;
         i += int64_t{gridDim.x} * blockDim.x) {
        const float value = residual[i] + gradient[i];
        residual[i] = value;
        if (clear_gradient) gradient[i] = 0.0f;
        const unsigned int key = __float_as_uint(value) & 0x7FFFFFFFu;
        max_key = max(max_key, key);
        max_finite = max(max_finite, key < sketch::kFloatInfKey ? key : 0u);
    }
    max_finite = __reduce_max_sync(0xFFFFFFFFu, max_finite);
    max_key = __reduce_max_sync(0xFFFFFFFFu, max_key);
    if (threadIdx.x % 32 == 0) {
        atomicMax(&extremes[0], max_finite);
        atomicMax(&extremes[1], max_key);
    }
}

__global__ void __launch_bounds__(kThreads)
integer_sums_kernel(const float* acc, int64_t d, SketchShape shape, const unsigned int* extremes,
                    u64* sums, unsigned int* flags) {
    const int s = sketch::scale_exponent(extremes[0], d > 1 ? d : 1);
    const double scale = ldexp(1.0, s);
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < d;
         i += int64_t{gridDim.x} * blockDim.x) {
        const float value = acc[i];
        const bool finite = (__float_as_uint(value) & 0x7FFFFFFFu) < sketch::kFloatInfKey;
        const u64 q = finite ? static_cast<u64>(static_cast<long long>(
                                   rint(static_cast<double>(value) * scale)))
                             : 0ull;
        for (int j = 0; j < shape.rows; ++j) {
            const int64_t cell = j * shape.columns +
                                 sketch::bucket(static_cast<uint64_t>(i), shape.keys[2 * j],
                                                shape.columns);
            const bool negate = sketch::negative(static_cast<uint64_t>(i), shape.keys[2 * j + 1]);
            if (finite) {
                if (q != 0) atomicAdd(&sums[cell], negate ? 0ull - q : q);
            } else {
                atomicOr(&flags[cell], sketch::nonfinite_flag(value, negate));
            }
        }
    }
}

__global__ void __launch_bounds__(kThreads)
table_values_kernel(const u64* sums, const unsigned int* flags, int64_t cells, int64_t d,
                    const unsigned int* extremes, float* table) {
    const int s = sketch::scale_exponent(extremes[0], d > 1 ? d : 1);
    const double inverse_scale = ldexp(1.0, -s);
    for (int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; c < cells;
         c += int64_t{gridDim.x} * blockDim.x) {
        table[c] = sketch::table_value(static_cast<int64_t>(sums[c]), flags[c], inverse_scale);
    }
}

__global__ void __launch_bounds__(kThreads)
estimate_kernel(const float* table, int64_t d, SketchShape shape, float* estimate) {
    float values[sketch::kMaxRows];
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < d;
         i += int64_t{gridDim.x} * blockDim.x) {
        for (int j = 0; j < shape.rows; ++j) {
            values[j] = sketch::row_value(table + j * shape.columns, static_cast<uint64_t>(i),
                                          shape.keys[2 * j], shape.keys[2 * j + 1],
                                          shape.columns);
        }
        estimate[i] = sketch::median(values, shape.rows);
    }
}

int grid_for(int64_t count) {
    const int device = detail::current_device();
    const int64_t resident = int64_t{std::max(detail::sm_count(device), 1)} * 8;
    return static_cast<int>(std::min(resident, detail::blocks_for(count, kThreads)));
}

// Workspace of sketch_table: the int64 sums, the flags, the two extremes.
struct TableLayout {
    size_t sums, flags, extremes, bytes;
    explicit TableLayout(int64_t cells) {
        detail::Layout layout;
        sums = layout.add<u64>(cells);
        flags = layout.add<unsigned int>(cells);
        extremes = layout.add<unsigned int>(2);
        bytes = layout.bytes();
    }
};

}  // namespace

size_t sketch_table_workspace_bytes(int rows, int64_t columns) {
    return TableLayout(std::max(rows, 1) * std::max<int64_t>(columns, 1)).bytes;
}

void sketch_table(float* gradient, float* residual, int64_t d, const uint32_t* keys, int rows,
                  int64_t columns, bool clear_gradient, float* table, void* stream,
                  Workspace workspace) {
    if (d < 0) throw std::invalid_argument("gtopk::cuda::sketch_table: d < 0");
    const SketchShape shape = shape_of(keys, rows, columns, "sketch_table");
    const int64_t cells = rows * columns;
    const TableLayout layout(cells);
    const auto s = static_cast<cudaStream_t>(stream);
    detail::with_workspace(workspace, layout.bytes, s, [&](const Workspace& scratch) {
        u64* sums = detail::piece<u64>(scratch, layout.sums);
        auto* flags = detail::piece<unsigned int>(scratch, layout.flags);
        auto* extremes = detail::piece<unsigned int>(scratch, layout.extremes);
        GTOPK_CUDA_CHECK(cudaMemsetAsync(scratch.data, 0, layout.bytes, s));
        if (d > 0) {
            accumulate_extremes_kernel<<<grid_for(d), kThreads, 0, s>>>(
                gradient, residual, d, clear_gradient, extremes);
            GTOPK_CUDA_CHECK_LAUNCH("accumulate_extremes_kernel");
            integer_sums_kernel<<<grid_for(d), kThreads, 0, s>>>(residual, d, shape, extremes,
                                                                 sums, flags);
            GTOPK_CUDA_CHECK_LAUNCH("integer_sums_kernel");
        }
        table_values_kernel<<<grid_for(cells), kThreads, 0, s>>>(sums, flags, cells, d,
                                                                 extremes, table);
        GTOPK_CUDA_CHECK_LAUNCH("table_values_kernel");
    });
}

void sketch_estimate(const float* table, const uint32_t* keys, int rows, int64_t columns,
                     int64_t d, float* estimate, void* stream) {
    if (d < 0) throw std::invalid_argument("gtopk::cuda::sketch_estimate: d < 0");
    const SketchShape shape = shape_of(keys, rows, columns, "sketch_estimate");
    if (d == 0) return;
    const auto s = static_cast<cudaStream_t>(stream);
    estimate_kernel<<<grid_for(d), kThreads, 0, s>>>(table, d, shape, estimate);
    GTOPK_CUDA_CHECK_LAUNCH("estimate_kernel");
}

}  // namespace gtopk::cuda
