// The bindings of module gtopk_hvd._C: one convention for the CPU and the CUDA entries.
//
// Every entry takes arrays as addresses (Address: a Python int, e.g. torch's tensor.data_ptr()
// for device memory, 0 for an absent optional array; or a host array, e.g. a numpy array, whose
// buffer gives the address of its first item, without a copy) with their lengths, and the kernels' type codes (ValueType, IndexType: types.h) for their dtypes. The
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

// An array's address as an entry takes it: from a Python int (0: no array), None (no array) or
// an object with the buffer protocol (its first item; the caller has checked it is contiguous).
struct Address {
    uintptr_t value = 0;
    operator uintptr_t() const { return value; }  // NOLINT: an address reads as one
};

template <typename T = void> T* as_pointer(uintptr_t address) {
    return reinterpret_cast<T*>(address);
}

// A count sketch has 1 <= rows <= sketch::kMaxRows and 1 <= columns <= sketch::kMaxColumns.
void check_sketch_shape(int64_t rows, int64_t columns);

void bind_types(py::module_& m);
void bind_cpu(py::module_& m);
void bind_cuda(py::module_& m);

}  // namespace gtopk::bindings

namespace pybind11::detail {

template <> struct type_caster<gtopk::bindings::Address> {
    PYBIND11_TYPE_CASTER(gtopk::bindings::Address, const_name("Address"));

    bool load(handle source, bool /*convert*/) {
        PyObject* object = source.ptr();
        if (object == Py_None) {
            value.value = 0;
            return true;
        }
        if (PyLong_Check(object)) {
            const unsigned long long address = PyLong_AsUnsignedLongLong(object);
            if (PyErr_Occurred()) {
                PyErr_Clear();
                return false;
            }
            value.value = static_cast<uintptr_t>(address);
            return true;
        }
        if (PyObject_CheckBuffer(object)) {
            Py_buffer view;
            if (PyObject_GetBuffer(object, &view, PyBUF_SIMPLE) != 0) {
                PyErr_Clear();
                return false;
            }
            value.value = reinterpret_cast<uintptr_t>(view.buf);
            PyBuffer_Release(&view);
            return true;
        }
        return false;
    }

    static handle cast(gtopk::bindings::Address address, return_value_policy, handle) {
        return PyLong_FromUnsignedLongLong(address.value);
    }
};

}  // namespace pybind11::detail
