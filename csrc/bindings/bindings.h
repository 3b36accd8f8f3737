// The bindings of module gtopk_hvd._C: one convention for the CPU and the CUDA entries.
//
// Every entry takes arrays as addresses (Python ints: numpy's array.ctypes.data for host memory,
// torch's tensor.data_ptr() for device memory; 0 for an absent optional array) with their
// lengths, and the kernels' type codes (ValueType, IndexType: types.h) for their dtypes. The
// Python layer checks the arrays before it takes their addresses, in one place
// (gtopk_hvd/ops/_support.py): device, contiguity, dtype, lengths that must agree, writeability,
// sorted index sets (first_not_increasing, the one read that check needs), index ranges; and it
// allocates every output whose length is known before the call. An entry checks only the rules
// of the contract it calls, the same function for both devices (gtopk/segments.h
// check_segments, gtopk/histogram_bins.h, the sketch's shape, the index width): each failure is
// std::invalid_argument, a ValueError in Python. Outputs whose length only the kernel finds
// (the CPU's threshold selections) come back as numpy arrays. Every kernel call releases the GIL.
//
// Files: module.cpp (the module), types.cpp (the type codes and constants), cpu.cpp (the CPU
// entries), cuda.cpp (the CUDA entries, built with the CUDA kernels).
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>

namespace gtopk::bindings {

namespace py = pybind11;

template <typename T = void> T* as_pointer(uintptr_t address) {
    return reinterpret_cast<T*>(address);
}

// A count sketch has 1 <= rows <= sketch::kMaxRows and 1 <= columns <= sketch::kMaxColumns.
void check_sketch_shape(int64_t rows, int64_t columns);

void bind_types(py::module_& m);
void bind_cpu(py::module_& m);
void bind_cuda(py::module_& m);

}  // namespace gtopk::bindings
