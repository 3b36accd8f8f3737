// Python bindings (module gtopk_hvd._C). The Python layer (gtopk_hvd/ops/) turns numpy arrays,
// torch and TF tensors into the forms taken here and checks devices; this layer checks what
// the kernels rely on (dtype, contiguity, lengths, sortedness) and releases the GIL to compute.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "gtopk/count_sketch.h"
#include "gtopk/cpu_ops.h"
#include "gtopk/histogram_bins.h"
#include "gtopk/segments.h"
#include "gtopk/types.h"
#ifdef GTOPK_WITH_CUDA
#include "gtopk/cuda_ops.h"
#endif

namespace py = pybind11;

namespace {

using gtopk::bfloat16_bits;
using gtopk::float16_bits;

// Calls body(T{}) with the C++ value type named by value_type; the array's itemsize must fit.
// Arithmetic: float32 / float64 only (the 16-bit bodies are not even instantiated).
template <bool Arithmetic, typename Body>
py::object with_value_type(const std::string& value_type, const py::array& x, Body&& body) {
    auto expect_size = [&](size_t size) {
        if (static_cast<size_t>(x.itemsize()) != size) {
            throw py::type_error("value_type '" + value_type + "' does not match an array of " +
                                 std::to_string(x.itemsize()) + "-byte items");
        }
    };
    if (value_type == "float32") { expect_size(4); return body(float{}); }
    if (value_type == "float64") { expect_size(8); return body(double{}); }
    if constexpr (!Arithmetic) {
        if (value_type == "float16") { expect_size(2); return body(float16_bits{}); }
        if (value_type == "bfloat16") { expect_size(2); return body(bfloat16_bits{}); }
    }
    throw py::type_error("unsupported value dtype '" + value_type + "'; expected " +
                         (Arithmetic ? "float32 or float64"
                                     : "float32, float64, float16 or bfloat16"));
}

void require_contiguous_1d(const py::array& a, const char* name) {
    if (a.ndim() != 1) throw py::value_error(std::string(name) + " must be 1-D");
    if (!(a.flags() & py::array::c_style)) {
        throw py::value_error(std::string(name) + " must be contiguous");
    }
}

// What the accumulating kernels rely on: residual += gradient in place, gradient = 0 if asked.
void require_accumulation(const py::array& gradient, const py::array& residual,
                          bool clear_gradient) {
    require_contiguous_1d(gradient, "gradient");
    require_contiguous_1d(residual, "residual");
    if (gradient.shape(0) != residual.shape(0) || !gradient.dtype().is(residual.dtype())) {
        throw py::value_error("gradient and residual must have the same length and dtype");
    }
    if (!residual.writeable()) throw py::value_error("residual must be writeable");
    if (clear_gradient && !gradient.writeable()) {
        throw py::value_error("gradient must be writeable to be cleared");
    }
    if (clear_gradient && gradient.data() == residual.data()) {
        throw py::value_error("gradient and residual must not be the same array when the "
                              "gradient is cleared");
    }
}

void require_range(int64_t begin, int64_t end, int64_t d) {
    if (!(0 <= begin && begin <= end && end <= d)) {
        throw py::value_error("need 0 <= begin <= end <= d, got begin=" + std::to_string(begin) +
                              ", end=" + std::to_string(end) + ", d=" + std::to_string(d));
    }
}

void require_nonnegative(int64_t k) {
    if (k < 0) throw py::value_error("k must be >= 0, got " + std::to_string(k));
}

template <typename Index> void require_sorted_unique(const py::array& index, const char* name) {
    const int64_t j = gtopk::cpu::first_not_increasing(static_cast<const Index*>(index.data()),
                                                       index.shape(0));
    if (j != 0) {
        throw py::value_error(std::string(name) +
                              " must be strictly increasing (sorted, no duplicates); "
                              "position " + std::to_string(j) + " breaks it");
    }
}

// numpy array of n items shaped like `like` (same dtype), or of Index.
py::array empty_like_values(const py::array& like, int64_t n) {
    return py::array(like.dtype(), std::vector<py::ssize_t>{static_cast<py::ssize_t>(n)});
}

py::tuple topk_abs(const py::array& x, int64_t k, const std::optional<py::array>& hint,
                   const std::string& value_type) {
    require_contiguous_1d(x, "x");
    require_nonnegative(k);
    if (hint && (hint->size() != 1 || hint->itemsize() != x.itemsize())) {
        throw py::value_error("threshold_hint must be one value of x's dtype");
    }
    const int64_t d = x.shape(0);
    const int64_t n = std::min(k, d);
    return with_value_type<false>(value_type, x, [&](auto tag) -> py::tuple {
        using T = decltype(tag);
        const T* data = static_cast<const T*>(x.data());
        const T* hint_ptr = hint ? static_cast<const T*>(hint->data()) : nullptr;
        py::array values = empty_like_values(x, n);
        T* out_value = static_cast<T*>(values.mutable_data());
        auto run = [&](auto index_tag) -> py::tuple {
            using Index = decltype(index_tag);
            py::array_t<Index> indices(n);
            Index* out_index = indices.mutable_data();
            {
                py::gil_scoped_release release;
                gtopk::cpu::topk_abs<T, Index>(data, d, k, hint_ptr, out_index, out_value);
            }
            return py::make_tuple(indices, values);
        };
        return gtopk::int32_indices_fit(d) ? run(int32_t{}) : run(int64_t{});
    });
}

py::tuple accumulate_select(const py::array& gradient, py::array& residual, int64_t k,
                            const std::optional<py::array>& hint, const std::string& value_type,
                            bool clear_gradient) {
    require_accumulation(gradient, residual, clear_gradient);
    require_nonnegative(k);
    if (hint && (hint->size() != 1 || hint->itemsize() != gradient.itemsize())) {
        throw py::value_error("threshold_hint must be one value of the gradient's dtype");
    }
    const int64_t d = gradient.shape(0);
    const int64_t n = std::min(k, d);
    return with_value_type<true>(value_type, gradient, [&](auto tag) -> py::tuple {
        using T = decltype(tag);
        // Written only when clear_gradient, which required a writeable array above.
        T* g = static_cast<T*>(const_cast<void*>(gradient.data()));
        T* r = static_cast<T*>(residual.mutable_data());
        const T* hint_ptr = hint ? static_cast<const T*>(hint->data()) : nullptr;
        py::array values = empty_like_values(gradient, n);
        T* out_value = static_cast<T*>(values.mutable_data());
        auto run = [&](auto index_tag) -> py::tuple {
            using Index = decltype(index_tag);
            py::array_t<Index> indices(n);
            Index* out_index = indices.mutable_data();
            {
                py::gil_scoped_release release;
                gtopk::cpu::accumulate_select<T, Index>(g, r, d, k, hint_ptr, out_index,
                                                        out_value, clear_gradient);
            }
            return py::make_tuple(indices, values);
        };
        return gtopk::int32_indices_fit(d) ? run(int32_t{}) : run(int64_t{});
    });
}

// offsets (segments + 1) and ks (segments) as int64 arrays, checked for a vector of d values.
int64_t checked_segments(const py::array_t<int64_t>& offsets, const py::array_t<int64_t>& ks,
                         int64_t d) {
    require_contiguous_1d(offsets, "offsets");
    require_contiguous_1d(ks, "ks");
    const int64_t segments = ks.shape(0);
    if (offsets.shape(0) != segments + 1) {
        throw py::value_error("offsets must hold one more value than ks");
    }
    try {
        gtopk::check_segments(offsets.data(), ks.data(), segments, d);
    } catch (const std::invalid_argument& error) {
        throw py::value_error(error.what());
    }
    return segments;
}

py::array_t<int64_t> segment_table(const py::array_t<int64_t>& offsets,
                                   const py::array_t<int64_t>& ks, int64_t d) {
    const int64_t segments = checked_segments(offsets, ks, d);
    const std::vector<int64_t> table = gtopk::segment_table(offsets.data(), ks.data(), segments);
    py::array_t<int64_t> result(static_cast<py::ssize_t>(table.size()));
    std::copy(table.begin(), table.end(), result.mutable_data());
    return result;
}

py::tuple segmented_accumulate_select(const std::optional<py::array>& gradient,
                                      py::array& residual, const py::array_t<int64_t>& offsets,
                                      const py::array_t<int64_t>& ks,
                                      const std::string& value_type, bool clear_gradient) {
    if (gradient) {
        require_accumulation(*gradient, residual, clear_gradient);
    } else {
        require_contiguous_1d(residual, "residual");
        if (!residual.writeable()) throw py::value_error("residual must be writeable");
        clear_gradient = false;
    }
    const int64_t d = residual.shape(0);
    const int64_t segments = checked_segments(offsets, ks, d);
    const std::vector<int64_t> table = gtopk::segment_table(offsets.data(), ks.data(), segments);
    const int64_t n = table[2 * segments + 1];  // out_offsets[segments]
    return with_value_type<true>(value_type, residual, [&](auto tag) -> py::tuple {
        using T = decltype(tag);
        // Written only when clear_gradient, which required a writeable array above.
        T* g = gradient ? static_cast<T*>(const_cast<void*>(gradient->data())) : nullptr;
        T* r = static_cast<T*>(residual.mutable_data());
        py::array values = empty_like_values(residual, n);
        T* out_value = static_cast<T*>(values.mutable_data());
        auto run = [&](auto index_tag) -> py::tuple {
            using Index = decltype(index_tag);
            py::array_t<Index> indices(n);
            Index* out_index = indices.mutable_data();
            {
                py::gil_scoped_release release;
                gtopk::cpu::segmented_accumulate_select<T, Index>(
                    g, r, offsets.data(), ks.data(), segments, out_index, out_value,
                    clear_gradient);
            }
            return py::make_tuple(indices, values);
        };
        return gtopk::int32_indices_fit(d) ? run(int32_t{}) : run(int64_t{});
    });
}

// Calls body(Index{}) for the index array's dtype (int32 or int64).
template <typename Body> py::object with_index_type(const py::array& index, Body&& body) {
    if (py::isinstance<py::array_t<int32_t>>(index) && index.itemsize() == 4) {
        return body(int32_t{});
    }
    if (py::isinstance<py::array_t<int64_t>>(index) && index.itemsize() == 8) {
        return body(int64_t{});
    }
    throw py::type_error("indices must be int32 or int64, got " +
                         std::string(py::str(index.dtype())));
}

void require_pair(const py::array& index, const py::array& value, const char* name) {
    require_contiguous_1d(index, name);
    require_contiguous_1d(value, name);
    if (index.shape(0) != value.shape(0)) {
        throw py::value_error(std::string(name) + ": indices and values differ in length (" +
                              std::to_string(index.shape(0)) + " vs " +
                              std::to_string(value.shape(0)) + ")");
    }
}

// out (optional): (indices, values) arrays of at least min(k, n_a + n_b) entries, of the sets'
// dtypes, that receive the result; the returned arrays are then views of their first n entries.
py::tuple merge_topk(const py::array& index_a, const py::array& value_a, const py::array& index_b,
                     const py::array& value_b, int64_t k, const std::string& value_type,
                     const std::optional<py::array>& out_index,
                     const std::optional<py::array>& out_value) {
    require_pair(index_a, value_a, "set a");
    require_pair(index_b, value_b, "set b");
    require_nonnegative(k);
    if (!index_a.dtype().is(index_b.dtype()) || !value_a.dtype().is(value_b.dtype())) {
        throw py::type_error("sets a and b must have the same index dtype and value dtype");
    }
    const int64_t n_a = index_a.shape(0), n_b = index_b.shape(0);
    const int64_t capacity = std::min(k, n_a + n_b);
    if (out_index.has_value() != out_value.has_value()) {
        throw py::value_error("out needs both an index array and a value array");
    }
    if (out_index) {
        require_contiguous_1d(*out_index, "out indices");
        require_contiguous_1d(*out_value, "out values");
        if (!out_index->dtype().is(index_a.dtype()) || !out_value->dtype().is(value_a.dtype())) {
            throw py::type_error("out arrays must have the sets' index dtype and value dtype");
        }
        if (out_index->shape(0) < capacity || out_value->shape(0) < capacity) {
            throw py::value_error("out arrays hold fewer than min(k, n_a + n_b) = " +
                                  std::to_string(capacity) + " entries");
        }
        if (!out_index->writeable() || !out_value->writeable()) {
            throw py::value_error("out arrays must be writeable");
        }
    }
    return with_index_type(index_a, [&](auto index_tag) -> py::tuple {
        using Index = decltype(index_tag);
        require_sorted_unique<Index>(index_a, "indices of set a");
        require_sorted_unique<Index>(index_b, "indices of set b");
        return with_value_type<true>(value_type, value_a, [&](auto tag) -> py::tuple {
            using T = decltype(tag);
            py::array indices = out_index ? *out_index : py::array(py::array_t<Index>(capacity));
            py::array values = out_value ? *out_value : empty_like_values(value_a, capacity);
            int64_t n;
            {
                py::gil_scoped_release release;
                n = gtopk::cpu::merge_topk<T, Index>(
                    static_cast<const Index*>(index_a.data()), static_cast<const T*>(value_a.data()),
                    n_a, static_cast<const Index*>(index_b.data()),
                    static_cast<const T*>(value_b.data()), n_b, k,
                    static_cast<Index*>(indices.mutable_data()),
                    static_cast<T*>(values.mutable_data()));
            }
            if (out_index || n < capacity) {
                py::slice first(0, n, 1);
                return py::make_tuple(indices[first], values[first]);
            }
            return py::make_tuple(indices, values);
        });
    });
}

void write_sparse(py::array& dest, const py::array& index, const py::array& value,
                  const std::string& value_type) {
    require_contiguous_1d(dest, "dest");
    require_pair(index, value, "sparse set");
    if (!dest.writeable()) throw py::value_error("dest must be writeable");
    if (!dest.dtype().is(value.dtype())) {
        throw py::type_error("dest and values must have the same dtype");
    }
    with_index_type(index, [&](auto index_tag) -> py::object {
        using Index = decltype(index_tag);
        require_sorted_unique<Index>(index, "indices");
        const Index* idx = static_cast<const Index*>(index.data());
        const int64_t d = dest.shape(0), n = index.shape(0);
        if (n > 0 && (idx[0] < 0 || idx[n - 1] >= d)) {
            throw py::index_error("indices out of range for dest of length " + std::to_string(d));
        }
        return with_value_type<true>(value_type, value, [&](auto tag) -> py::object {
            using T = decltype(tag);
            py::gil_scoped_release release;
            gtopk::cpu::write_sparse<T, Index>(static_cast<T*>(dest.mutable_data()), d, idx,
                                               static_cast<const T*>(value.data()), n);
            return py::none();
        });
    });
}

void restore_residual(py::array& residual, const py::array& index, const py::array& value,
                      const py::array_t<uint8_t>& restore, const std::string& value_type) {
    require_contiguous_1d(residual, "residual");
    require_pair(index, value, "restore set");
    if (restore.ndim() != 1 || restore.shape(0) != index.shape(0)) {
        throw py::value_error("restore mask must have one entry per index");
    }
    if (!residual.dtype().is(value.dtype())) {
        throw py::type_error("residual and values must have the same dtype");
    }
    with_index_type(index, [&](auto index_tag) -> py::object {
        using Index = decltype(index_tag);
        const Index* idx = static_cast<const Index*>(index.data());
        const int64_t d = residual.shape(0);
        for (py::ssize_t j = 0; j < index.shape(0); ++j) {
            if (idx[j] < 0 || idx[j] >= d) {
                throw py::index_error("index " + std::to_string(idx[j]) +
                                      " out of range for a residual of length " +
                                      std::to_string(d));
            }
        }
        return with_value_type<true>(value_type, value, [&](auto tag) -> py::object {
            using T = decltype(tag);
            py::gil_scoped_release release;
            gtopk::cpu::restore_residual<T, Index>(
                static_cast<T*>(residual.mutable_data()), d, idx,
                static_cast<const T*>(value.data()), restore.data(), index.shape(0));
            return py::none();
        });
    });
}

py::array_t<uint8_t> mark_survivors(const py::array& local_index, const py::array& global_index) {
    require_contiguous_1d(local_index, "local indices");
    require_contiguous_1d(global_index, "global indices");
    if (!local_index.dtype().is(global_index.dtype())) {
        throw py::type_error("local and global indices must have the same dtype");
    }
    py::array_t<uint8_t> survived(local_index.shape(0));
    with_index_type(local_index, [&](auto index_tag) -> py::object {
        using Index = decltype(index_tag);
        require_sorted_unique<Index>(local_index, "local indices");
        require_sorted_unique<Index>(global_index, "global indices");
        gtopk::cpu::mark_survivors<Index>(
            static_cast<const Index*>(local_index.data()), local_index.shape(0),
            static_cast<const Index*>(global_index.data()), global_index.shape(0),
            survived.mutable_data());
        return py::none();
    });
    return survived;
}

// gradient None: no accumulation, a read of residual's [begin, end) (cpu_ops.h).
py::tuple accumulate_threshold(const std::optional<py::array>& gradient, py::array& residual,
                               int64_t begin, int64_t end, uint64_t threshold_key,
                               uint64_t histogram_base_key, int histogram_shift, int64_t n_bins,
                               const std::string& value_type, bool clear_gradient,
                               int64_t n_fine, int coarse_shift) {
    if (gradient) {
        require_accumulation(*gradient, residual, clear_gradient);
    } else {
        require_contiguous_1d(residual, "residual");
        clear_gradient = false;
    }
    const int64_t d = residual.shape(0);
    require_range(begin, end, d);
    gtopk::check_histogram_arguments(n_bins, n_fine, histogram_shift, coarse_shift);
    py::array_t<int64_t> histogram(n_bins);
    return with_value_type<true>(value_type, residual, [&](auto tag) -> py::tuple {
        using T = decltype(tag);
        using Key = gtopk::MagnitudeKey<T>;
        gtopk::check_keys_fit<Key>(threshold_key, histogram_base_key);
        // Written only when clear_gradient, which required a writeable array above.
        T* g = gradient ? static_cast<T*>(const_cast<void*>(gradient->data())) : nullptr;
        T* r = static_cast<T*>(residual.mutable_data());
        auto run = [&](auto index_tag) -> py::tuple {
            using Index = decltype(index_tag);
            std::vector<Index> selected;
            {
                py::gil_scoped_release release;
                gtopk::cpu::accumulate_threshold<T, Index>(
                    g, r, d, begin, end, static_cast<Key>(threshold_key),
                    static_cast<Key>(histogram_base_key), histogram_shift, n_bins,
                    histogram.mutable_data(), clear_gradient, selected, n_fine, coarse_shift);
            }
            py::array_t<Index> indices(static_cast<py::ssize_t>(selected.size()));
            std::copy(selected.begin(), selected.end(), indices.mutable_data());
            return py::make_tuple(indices, histogram);
        };
        return gtopk::int32_indices_fit(d) ? run(int32_t{}) : run(int64_t{});
    });
}

py::array threshold_indices(const py::array& x, int64_t begin, int64_t end,
                            uint64_t threshold_key, const std::string& value_type) {
    require_contiguous_1d(x, "x");
    const int64_t d = x.shape(0);
    require_range(begin, end, d);
    return with_value_type<true>(value_type, x, [&](auto tag) -> py::array {
        using T = decltype(tag);
        gtopk::check_keys_fit<gtopk::MagnitudeKey<T>>(threshold_key);
        const T* data = static_cast<const T*>(x.data());
        auto run = [&](auto index_tag) -> py::array {
            using Index = decltype(index_tag);
            std::vector<Index> selected;
            {
                py::gil_scoped_release release;
                gtopk::cpu::threshold_indices<T, Index>(
                    data, begin, end, static_cast<gtopk::MagnitudeKey<T>>(threshold_key),
                    selected);
            }
            py::array_t<Index> indices(static_cast<py::ssize_t>(selected.size()));
            std::copy(selected.begin(), selected.end(), indices.mutable_data());
            return indices;
        };
        return gtopk::int32_indices_fit(d) ? run(int32_t{}) : run(int64_t{});
    });
}

// The rows of a count sketch's keys: a C-contiguous uint32 array of shape (rows, 2) with
// 1 <= rows <= kMaxRows; 1 <= columns <= kMaxColumns.
int sketch_rows(const py::array& keys, int64_t columns) {
    if (!py::isinstance<py::array_t<uint32_t>>(keys) || keys.itemsize() != 4 ||
        keys.ndim() != 2 || keys.shape(1) != 2 || !(keys.flags() & py::array::c_style)) {
        throw py::type_error("keys must be a C-contiguous uint32 array of shape (rows, 2)");
    }
    const int64_t rows = keys.shape(0);
    if (rows < 1 || rows > gtopk::sketch::kMaxRows) {
        throw py::value_error("a count sketch has 1 to " +
                              std::to_string(gtopk::sketch::kMaxRows) + " rows, got " +
                              std::to_string(rows));
    }
    if (columns < 1 || columns > gtopk::sketch::kMaxColumns) {
        throw py::value_error("a count sketch needs columns >= 1 and < 2^32, got " +
                              std::to_string(columns));
    }
    return static_cast<int>(rows);
}

void require_float32(const py::array& a, const char* name) {
    if (!py::isinstance<py::array_t<float>>(a) || a.itemsize() != 4) {
        throw py::type_error(std::string(name) + " must be float32 (the sketch sums float32)");
    }
}

py::array_t<float> sketch_table(const std::optional<py::array>& gradient,
                                const py::array& residual, const py::array& keys, int64_t columns,
                                bool clear_gradient) {
    if (gradient) {
        require_accumulation(*gradient, residual, clear_gradient);
    } else {  // read only
        require_contiguous_1d(residual, "residual");
        clear_gradient = false;
    }
    require_float32(residual, "residual");
    const int rows = sketch_rows(keys, columns);
    py::array_t<float> table({static_cast<py::ssize_t>(rows), static_cast<py::ssize_t>(columns)});
    float* g = gradient ? static_cast<float*>(const_cast<void*>(gradient->data())) : nullptr;
    float* r = static_cast<float*>(const_cast<void*>(residual.data()));  // written with a gradient
    const auto* k = static_cast<const uint32_t*>(keys.data());
    float* out = table.mutable_data();
    {
        py::gil_scoped_release release;
        gtopk::cpu::sketch_table(g, r, residual.shape(0), k, rows, columns, clear_gradient, out);
    }
    return table;
}

py::tuple sketch_select(const py::array& table, const py::array& keys, int64_t columns,
                        std::optional<py::array> estimate, int64_t k, int64_t d) {
    const int rows = sketch_rows(keys, columns);
    require_contiguous_1d(table, "table");
    require_float32(table, "table");
    if (table.shape(0) != rows * columns) {
        throw py::value_error("the table holds " + std::to_string(table.shape(0)) +
                              " values, rows x columns = " + std::to_string(rows * columns));
    }
    require_nonnegative(k);
    if (d < 0 && !estimate) throw py::value_error("d must be >= 0 without an estimate buffer");
    if (d < 0) d = estimate->shape(0);  // d = -1: the buffer's size
    float* est = nullptr;
    if (estimate) {
        require_contiguous_1d(*estimate, "estimate");
        require_float32(*estimate, "estimate");
        if (!estimate->writeable()) throw py::value_error("estimate must be writeable");
        if (estimate->shape(0) != d) {
            throw py::value_error("d = " + std::to_string(d) + " but the estimate buffer holds " +
                                  std::to_string(estimate->shape(0)) + " values");
        }
        est = static_cast<float*>(estimate->mutable_data());
    }
    const int64_t n = std::min(k, d);
    const auto* t = static_cast<const float*>(table.data());
    const auto* key_words = static_cast<const uint32_t*>(keys.data());
    py::array_t<float> values(n);
    auto run = [&](auto index_tag) -> py::tuple {
        using Index = decltype(index_tag);
        py::array_t<Index> indices(n);
        {
            py::gil_scoped_release release;
            gtopk::cpu::sketch_select<Index>(t, key_words, rows, columns, d, k, est,
                                             indices.mutable_data(), values.mutable_data());
        }
        return py::make_tuple(indices, values);
    };
    return gtopk::int32_indices_fit(d) ? run(int32_t{}) : run(int64_t{});
}

uint64_t read_pass(const py::array& x) {
    require_contiguous_1d(x, "x");
    const int64_t d = x.shape(0);
    py::gil_scoped_release release;
    if (x.itemsize() == 8) return gtopk::cpu::read_pass(static_cast<const double*>(x.data()), d);
    if (x.itemsize() == 4) return gtopk::cpu::read_pass(static_cast<const float*>(x.data()), d);
    throw std::invalid_argument("read_pass takes float32 or float64");
}

// The largest magnitude key of x (+ y) over the finite values only or all (cpu_ops.h max_key).
uint64_t max_key(const py::array& x, const std::optional<py::array>& y, bool finite_only,
                 const std::string& value_type) {
    require_contiguous_1d(x, "x");
    if (y) {
        require_contiguous_1d(*y, "y");
        if (y->shape(0) != x.shape(0) || !y->dtype().is(x.dtype())) {
            throw py::value_error("x and y must have the same length and dtype");
        }
    }
    const int64_t n = x.shape(0);
    return with_value_type<false>(value_type, x, [&](auto tag) -> py::object {
        using T = decltype(tag);
        const T* y_data = y ? static_cast<const T*>(y->data()) : nullptr;
        if (!std::is_floating_point_v<T> && y_data != nullptr) {
            throw py::type_error("max_key adds y to x for float32 / float64 only");
        }
        uint64_t key;
        {
            py::gil_scoped_release release;
            key = gtopk::cpu::max_key<T>(static_cast<const T*>(x.data()), y_data, n, finite_only);
        }
        return py::int_(key);
    }).template cast<uint64_t>();
}

// The sorted union of two strictly increasing index arrays of one dtype (cpu_ops.h).
py::array sorted_union(const py::array& a, const py::array& b) {
    require_contiguous_1d(a, "a");
    require_contiguous_1d(b, "b");
    if (!a.dtype().is(b.dtype())) throw py::type_error("a and b must have the same dtype");
    return with_index_type(a, [&](auto index_tag) -> py::object {
        using Index = decltype(index_tag);
        require_sorted_unique<Index>(a, "a");
        require_sorted_unique<Index>(b, "b");
        py::array_t<Index> out(a.shape(0) + b.shape(0));
        int64_t n;
        {
            py::gil_scoped_release release;
            n = gtopk::cpu::sorted_union<Index>(
                static_cast<const Index*>(a.data()), a.shape(0),
                static_cast<const Index*>(b.data()), b.shape(0), out.mutable_data());
        }
        return out[py::slice(0, n, 1)];
    });
}

void bind_types(py::module_& m) {
    using gtopk::IndexType;
    using gtopk::ValueType;
    py::enum_<ValueType>(m, "ValueType", "Value dtype codes of the CUDA kernels (dtype names).")
        .value("float32", ValueType::kFloat32)
        .value("float64", ValueType::kFloat64)
        .value("float16", ValueType::kFloat16)
        .value("bfloat16", ValueType::kBFloat16);
    py::enum_<IndexType>(m, "IndexType", "Index dtype codes of the CUDA kernels (dtype names).")
        .value("int32", IndexType::kInt32)
        .value("int64", IndexType::kInt64);
    m.attr("INT32_INDEX_LIMIT") = gtopk::kInt32IndexLimit;
    m.attr("SKETCH_MAX_ROWS") = gtopk::sketch::kMaxRows;
    m.def("int32_indices_fit", &gtopk::int32_indices_fit, py::arg("d"),
          "True iff the indices 0 .. d-1 of a dense length d fit in int32 "
          "(d <= INT32_INDEX_LIMIT).");
}

#ifdef GTOPK_WITH_CUDA
// CUDA entry points take device pointers as integers; gtopk_hvd/ops/ allocates the outputs
// and the workspace (workspace 0: the cached one) and passes the current stream.
void* as_pointer(uintptr_t address) { return reinterpret_cast<void*>(address); }

void bind_cuda(py::module_& m) {
    using gtopk::IndexType;
    using gtopk::ValueType;
    using gtopk::cuda::Workspace;
    m.def("cuda_select_workspace_bytes", &gtopk::cuda::select_workspace_bytes,
          py::arg("value_type"), py::arg("index_type"), py::arg("d"), py::arg("k"),
          "Workspace bytes of cuda_topk_abs and cuda_accumulate_select (0: none needed).");
    m.def("cuda_merge_topk_workspace_bytes", &gtopk::cuda::merge_topk_workspace_bytes,
          py::arg("value_type"), py::arg("index_type"), py::arg("n_a"), py::arg("n_b"),
          py::arg("k"));
    m.def("cuda_topk_abs", [](ValueType value_type, IndexType index_type, uintptr_t x, int64_t d,
                              int64_t k, uintptr_t out_index, uintptr_t out_value,
                              uintptr_t stream, uintptr_t workspace, size_t workspace_bytes) {
        py::gil_scoped_release release;
        return gtopk::cuda::topk_abs(value_type, index_type, as_pointer(x), d, k,
                                     as_pointer(out_index), as_pointer(out_value),
                                     as_pointer(stream),
                                     Workspace{as_pointer(workspace), workspace_bytes});
    });
    m.def("cuda_accumulate_select", [](ValueType value_type, IndexType index_type,
                                       uintptr_t gradient, uintptr_t residual, int64_t d,
                                       int64_t k, uintptr_t out_index, uintptr_t out_value,
                                       uintptr_t stream, uintptr_t workspace,
                                       size_t workspace_bytes, uintptr_t skip) {
        py::gil_scoped_release release;
        return gtopk::cuda::accumulate_select(
            value_type, index_type, as_pointer(gradient), as_pointer(residual), d, k,
            as_pointer(out_index), as_pointer(out_value), as_pointer(stream),
            Workspace{as_pointer(workspace), workspace_bytes},
            static_cast<const int32_t*>(as_pointer(skip)));
    });
    m.def("cuda_segmented_select_workspace_bytes", [](ValueType value_type,
                                                      IndexType index_type,
                                                      const py::array_t<int64_t>& table) {
        require_contiguous_1d(table, "table");
        return gtopk::cuda::segmented_select_workspace_bytes(
            value_type, index_type, table.data(), table.shape(0) / gtopk::kSegmentTableRows - 1);
    }, py::arg("value_type"), py::arg("index_type"), py::arg("table"),
          "Workspace bytes of cuda_segmented_accumulate_select (table: segment_table's).");
    m.def("cuda_segmented_accumulate_select", [](ValueType value_type, IndexType index_type,
                                                 uintptr_t gradient, uintptr_t residual,
                                                 int64_t d, const py::array_t<int64_t>& table,
                                                 uintptr_t device_table, bool clear_gradient,
                                                 uintptr_t out_index, uintptr_t out_value,
                                                 uintptr_t stream, uintptr_t workspace,
                                                 size_t workspace_bytes, uintptr_t skip) {
        require_contiguous_1d(table, "table");
        if (table.shape(0) % gtopk::kSegmentTableRows != 0 || table.shape(0) == 0) {
            throw py::value_error("table must be segment_table's (3 rows of segments + 1)");
        }
        const int64_t segments = table.shape(0) / gtopk::kSegmentTableRows - 1;
        const int64_t* host_table = table.data();
        py::gil_scoped_release release;
        return gtopk::cuda::segmented_accumulate_select(
            value_type, index_type, as_pointer(gradient), as_pointer(residual), d, host_table,
            static_cast<const int64_t*>(as_pointer(device_table)), segments,
            as_pointer(out_index), as_pointer(out_value), clear_gradient, as_pointer(stream),
            Workspace{as_pointer(workspace), workspace_bytes},
            static_cast<const int32_t*>(as_pointer(skip)));
    });
    m.def("cuda_merge_topk", [](ValueType value_type, IndexType index_type, uintptr_t index_a,
                                uintptr_t value_a, int64_t n_a, uintptr_t index_b,
                                uintptr_t value_b, int64_t n_b, int64_t k, uintptr_t out_index,
                                uintptr_t out_value, uintptr_t stream, uintptr_t workspace,
                                size_t workspace_bytes) {
        py::gil_scoped_release release;
        return gtopk::cuda::merge_topk(value_type, index_type, as_pointer(index_a),
                                       as_pointer(value_a), n_a, as_pointer(index_b),
                                       as_pointer(value_b), n_b, k, as_pointer(out_index),
                                       as_pointer(out_value), as_pointer(stream),
                                       Workspace{as_pointer(workspace), workspace_bytes});
    });
    m.def("cuda_accumulate_count_workspace_bytes", &gtopk::cuda::accumulate_count_workspace_bytes,
          py::arg("n_bins"));
    m.def("cuda_accumulate_count", [](ValueType value_type, uintptr_t gradient,
                                      uintptr_t residual, int64_t d, int64_t begin, int64_t end,
                                      uint64_t threshold_key, uint64_t histogram_base_key,
                                      int histogram_shift, int64_t n_bins, int64_t n_fine,
                                      int coarse_shift, bool clear_gradient, uintptr_t stream,
                                      uintptr_t workspace, size_t workspace_bytes,
                                      uintptr_t device_counts) {
        gtopk::check_histogram_arguments(n_bins, n_fine, histogram_shift, coarse_shift);
        py::array_t<int64_t> histogram(device_counts != 0 ? 0 : n_bins);  // sized by the check
        int64_t* counts = histogram.mutable_data();
        int64_t selected = 0;
        {
            py::gil_scoped_release release;
            selected = gtopk::cuda::accumulate_count(
                value_type, as_pointer(gradient), as_pointer(residual), d, begin, end,
                threshold_key, histogram_base_key, histogram_shift, n_bins, n_fine, coarse_shift,
                clear_gradient, counts, as_pointer(stream),
                Workspace{as_pointer(workspace), workspace_bytes},
                static_cast<int64_t*>(as_pointer(device_counts)));
        }
        if (device_counts != 0) return py::tuple(py::make_tuple(selected, py::none()));
        return py::tuple(py::make_tuple(selected, histogram));
    }, "(count at or above the threshold, histogram): cpu accumulate_threshold's first half; "
       "with device_counts (n_bins + 1 int64 on the device) both are left there: (-1, None), no "
       "wait.", py::arg("value_type"), py::arg("gradient"), py::arg("residual"), py::arg("d"),
       py::arg("begin"), py::arg("end"), py::arg("threshold_key"), py::arg("histogram_base_key"),
       py::arg("histogram_shift"), py::arg("n_bins"), py::arg("n_fine"), py::arg("coarse_shift"),
       py::arg("clear_gradient"), py::arg("stream"), py::arg("workspace"),
       py::arg("workspace_bytes"), py::arg("device_counts") = 0);
    m.def("cuda_threshold_indices_workspace_bytes",
          &gtopk::cuda::threshold_indices_workspace_bytes, py::arg("value_type"),
          py::arg("index_type"), py::arg("n"));
    m.def("cuda_threshold_indices", [](ValueType value_type, IndexType index_type, uintptr_t x,
                                       int64_t d, int64_t begin, int64_t end,
                                       uint64_t threshold_key, uintptr_t out_index,
                                       int64_t capacity, uintptr_t stream, uintptr_t workspace,
                                       size_t workspace_bytes, uintptr_t device_count) {
        py::gil_scoped_release release;
        return gtopk::cuda::threshold_indices(value_type, index_type, as_pointer(x), d, begin,
                                              end, threshold_key, as_pointer(out_index),
                                              capacity, as_pointer(stream),
                                              Workspace{as_pointer(workspace), workspace_bytes},
                                              static_cast<int64_t*>(as_pointer(device_count)));
    }, py::arg("value_type"), py::arg("index_type"), py::arg("x"), py::arg("d"),
       py::arg("begin"), py::arg("end"), py::arg("threshold_key"), py::arg("out_index"),
       py::arg("capacity"), py::arg("stream"), py::arg("workspace"), py::arg("workspace_bytes"),
       py::arg("device_count") = 0);
    m.def("cuda_sketch_table_workspace_bytes", [](const py::array& keys, int64_t columns,
                                                  int64_t tile_columns) {
        return gtopk::cuda::sketch_table_workspace_bytes(sketch_rows(keys, columns), columns,
                                                         tile_columns);
    }, py::arg("keys"), py::arg("columns"), py::arg("tile_columns") = 0,
       "Workspace bytes of cuda_sketch_table.");
    m.def("cuda_sketch_table", [](uintptr_t gradient, uintptr_t residual, int64_t d,
                                  const py::array& keys, int64_t columns, bool clear_gradient,
                                  uintptr_t table, uintptr_t stream, uintptr_t workspace,
                                  size_t workspace_bytes, int64_t tile_columns, uintptr_t skip) {
        const int rows = sketch_rows(keys, columns);
        const auto* key_words = static_cast<const uint32_t*>(keys.data());
        py::gil_scoped_release release;
        gtopk::cuda::sketch_table(static_cast<float*>(as_pointer(gradient)),
                                  static_cast<float*>(as_pointer(residual)), d, key_words, rows,
                                  columns, clear_gradient, static_cast<float*>(as_pointer(table)),
                                  as_pointer(stream),
                                  Workspace{as_pointer(workspace), workspace_bytes},
                                  tile_columns, static_cast<const int32_t*>(as_pointer(skip)));
    }, py::arg("gradient"), py::arg("residual"), py::arg("d"), py::arg("keys"),
       py::arg("columns"), py::arg("clear_gradient"), py::arg("table"), py::arg("stream"),
       py::arg("workspace"), py::arg("workspace_bytes"), py::arg("tile_columns") = 0,
       py::arg("skip") = 0);
    m.def("cuda_sketch_select_workspace_bytes", [](IndexType index_type, int64_t d, int64_t k,
                                                   std::optional<py::array> keys,
                                                   int64_t columns) {
        if (!keys) {  // the selection without the row bitmaps (what callers before them asked)
            return gtopk::cuda::select_workspace_bytes(gtopk::ValueType::kFloat32,
                                                       index_type, d, k);
        }
        return gtopk::cuda::sketch_select_workspace_bytes(index_type, d, k,
                                                          sketch_rows(*keys, columns), columns);
    }, py::arg("index_type"), py::arg("d"), py::arg("k"), py::arg("keys") = py::none(),
       py::arg("columns") = 0,
       "Workspace bytes of cuda_sketch_select: with the keys and columns, room for the row "
       "bitmaps of its pass 1; without, the selection reads every estimate.");
    m.def("cuda_sketch_select", [](uintptr_t table, const py::array& keys, int64_t columns,
                                   int64_t d, int64_t k, IndexType index_type,
                                   uintptr_t out_index, uintptr_t out_value, uintptr_t stream,
                                   uintptr_t workspace, size_t workspace_bytes) {
        const int rows = sketch_rows(keys, columns);
        const auto* key_words = static_cast<const uint32_t*>(keys.data());
        py::gil_scoped_release release;
        return gtopk::cuda::sketch_select(static_cast<const float*>(as_pointer(table)), key_words,
                                          rows, columns, d, k, index_type, as_pointer(out_index),
                                          static_cast<float*>(as_pointer(out_value)),
                                          as_pointer(stream),
                                          Workspace{as_pointer(workspace), workspace_bytes});
    }, "The top-k of the sketch's estimates, computed inside the selection (no estimate buffer).");
    m.def("cuda_sketch_estimate", [](uintptr_t table, const py::array& keys, int64_t columns,
                                     int64_t d, uintptr_t estimate, uintptr_t stream) {
        const int rows = sketch_rows(keys, columns);
        const auto* key_words = static_cast<const uint32_t*>(keys.data());
        py::gil_scoped_release release;
        gtopk::cuda::sketch_estimate(static_cast<const float*>(as_pointer(table)), key_words,
                                     rows, columns, d, static_cast<float*>(as_pointer(estimate)),
                                     as_pointer(stream));
    });
    m.def("cuda_max_key_workspace_bytes", &gtopk::cuda::max_key_workspace_bytes,
          py::arg("value_type"), py::arg("n"));
    m.def("cuda_max_key", [](ValueType value_type, uintptr_t x, uintptr_t y, int64_t n,
                             bool finite_only, uintptr_t stream, uintptr_t workspace,
                             size_t workspace_bytes) {
        py::gil_scoped_release release;
        return gtopk::cuda::max_key(value_type, as_pointer(x), as_pointer(y), n, finite_only,
                                    as_pointer(stream),
                                    Workspace{as_pointer(workspace), workspace_bytes});
    }, "The largest magnitude key of x (+ y; y = 0: none), finite values only if asked.");
    m.def("cuda_mark_nonfinite", [](ValueType value_type, uintptr_t x, int64_t n, uintptr_t flag,
                                    uintptr_t stream, uintptr_t workspace,
                                    size_t workspace_bytes) {
        py::gil_scoped_release release;
        gtopk::cuda::mark_nonfinite(value_type, as_pointer(x), n,
                                    static_cast<int32_t*>(as_pointer(flag)), as_pointer(stream),
                                    Workspace{as_pointer(workspace), workspace_bytes});
    }, "*flag = 1 if x holds a NaN or Inf, enqueued on the stream (no host wait).");
    m.def("cuda_momentum_update", [](ValueType value_type, uintptr_t velocity,
                                     uintptr_t gradient, int64_t n, double momentum,
                                     double divisor, uintptr_t stream, uintptr_t skip) {
        py::gil_scoped_release release;
        gtopk::cuda::momentum_update(value_type, as_pointer(velocity), as_pointer(gradient), n,
                                     momentum, divisor, as_pointer(stream),
                                     static_cast<const int32_t*>(as_pointer(skip)));
    }, "velocity = momentum * velocity + gradient / divisor in one pass (no host wait).");
    m.def("cuda_restore_residual", [](ValueType value_type, IndexType index_type,
                                      uintptr_t residual, uintptr_t index, uintptr_t value,
                                      uintptr_t restore, int64_t n, uintptr_t stream) {
        py::gil_scoped_release release;
        gtopk::cuda::restore_residual(value_type, index_type, as_pointer(residual),
                                      as_pointer(index), as_pointer(value),
                                      static_cast<const uint8_t*>(as_pointer(restore)), n,
                                      as_pointer(stream));
    });
    m.def("cuda_restore_unselected", [](ValueType value_type, IndexType index_type,
                                        uintptr_t residual, uintptr_t index, uintptr_t value,
                                        int64_t n, uintptr_t selected, int64_t n_selected,
                                        uintptr_t stream, uintptr_t skip) {
        py::gil_scoped_release release;
        gtopk::cuda::restore_unselected(value_type, index_type, as_pointer(residual),
                                        as_pointer(index), as_pointer(value), n,
                                        as_pointer(selected), n_selected, as_pointer(stream),
                                        static_cast<const int32_t*>(as_pointer(skip)));
    }, "residual[index[j]] += value[j] where index[j] is not in the sorted `selected`.");
    m.def("cuda_zero_at", [](ValueType value_type, IndexType index_type, uintptr_t x,
                             uintptr_t index, int64_t n, uintptr_t stream, uintptr_t skip) {
        py::gil_scoped_release release;
        gtopk::cuda::zero_at(value_type, index_type, as_pointer(x), as_pointer(index), n,
                             as_pointer(stream), static_cast<const int32_t*>(as_pointer(skip)));
    }, "x[index] = 0 unless the skip flag is set.");
    m.def("cuda_take_at", [](ValueType value_type, IndexType index_type, uintptr_t residual,
                             uintptr_t index, int64_t n, uintptr_t taken_index,
                             uintptr_t taken_value, int64_t n_taken, uintptr_t out,
                             uintptr_t stream, uintptr_t skip) {
        py::gil_scoped_release release;
        gtopk::cuda::take_at(value_type, index_type, as_pointer(residual), as_pointer(index), n,
                             as_pointer(taken_index), as_pointer(taken_value), n_taken,
                             as_pointer(out), as_pointer(stream),
                             static_cast<const int32_t*>(as_pointer(skip)));
    }, "out = residual[index] (+ the taken values there); residual[index] = 0 unless skipped.");
    m.def("cuda_write_sparse", [](ValueType value_type, IndexType index_type, uintptr_t dest,
                                  int64_t d, uintptr_t index, uintptr_t value, int64_t n,
                                  bool zeroed, uintptr_t stream, uintptr_t skip) {
        py::gil_scoped_release release;
        gtopk::cuda::write_sparse(value_type, index_type, as_pointer(dest), d, as_pointer(index),
                                  as_pointer(value), n, zeroed, as_pointer(stream),
                                  static_cast<const int32_t*>(as_pointer(skip)));
    }, "dest = 0 except dest[index] = value (all NaN if the skip flag is set).");
}
#endif

}  // namespace

PYBIND11_MODULE(_C, m) {
    m.doc() = "gtopk_hvd C++/CUDA kernels: exact top-k by magnitude, sparse merge, residuals";
    m.def("topk_abs", &topk_abs, py::arg("x"), py::arg("k"), py::arg("threshold_hint"),
          py::arg("value_type"));
    m.def("accumulate_select", &accumulate_select, py::arg("gradient"), py::arg("residual"),
          py::arg("k"), py::arg("threshold_hint"), py::arg("value_type"),
          py::arg("clear_gradient") = false);
    m.def("segment_table", &segment_table, py::arg("offsets"), py::arg("ks"), py::arg("d"),
          "The segments' table (gtopk/segments.h), checked for a vector of d values.");
    m.def("segmented_accumulate_select", &segmented_accumulate_select, py::arg("gradient"),
          py::arg("residual"), py::arg("offsets"), py::arg("ks"), py::arg("value_type"),
          py::arg("clear_gradient"));
    m.def("accumulate_threshold", &accumulate_threshold, py::arg("gradient"),
          py::arg("residual"), py::arg("begin"), py::arg("end"), py::arg("threshold_key"),
          py::arg("histogram_base_key"), py::arg("histogram_shift"), py::arg("n_bins"),
          py::arg("value_type"), py::arg("clear_gradient") = false, py::arg("n_fine") = -1,
          py::arg("coarse_shift") = 0);
    m.def("threshold_indices", &threshold_indices, py::arg("x"), py::arg("begin"),
          py::arg("end"), py::arg("threshold_key"), py::arg("value_type"));
    m.def("merge_topk", &merge_topk, py::arg("index_a"), py::arg("value_a"), py::arg("index_b"),
          py::arg("value_b"), py::arg("k"), py::arg("value_type"),
          py::arg("out_index") = py::none(), py::arg("out_value") = py::none());
    m.def("write_sparse", &write_sparse, py::arg("dest"), py::arg("index"), py::arg("value"),
          py::arg("value_type"), "dest = 0 except dest[index] = value, in one pass.");
    m.def("set_num_threads", &gtopk::cpu::set_max_threads, py::arg("n"),
          "Threads of the CPU kernels; 0: OpenMP's default (OMP_NUM_THREADS).");
    m.def("get_num_threads", &gtopk::cpu::max_threads);
    m.def("restore_residual", &restore_residual, py::arg("residual"), py::arg("index"),
          py::arg("value"), py::arg("restore"), py::arg("value_type"));
    m.def("sketch_table", &sketch_table, py::arg("gradient"), py::arg("residual"),
          py::arg("keys"), py::arg("columns"), py::arg("clear_gradient") = false,
          "residual += gradient; the count sketch of the residual (rows x columns float32).");
    m.def("sketch_select", &sketch_select, py::arg("table"), py::arg("keys"), py::arg("columns"),
          py::arg("estimate"), py::arg("k"), py::arg("d") = -1,
          "The top-k of the sketch's estimates of d entries (indices, values); estimate: a "
          "buffer of d float32 filled with them, or None (none are stored).");
    m.def("read_pass", &read_pass, py::arg("x"),
          "Benchmark floor: one multi-threaded read of x (returns its largest magnitude key).");
    m.def("mark_survivors", &mark_survivors, py::arg("local_index"), py::arg("global_index"));
    m.def("max_key", &max_key, py::arg("x"), py::arg("y"), py::arg("finite_only"),
          py::arg("value_type"),
          "The largest magnitude key of x (+ y) over every value, or over the finite ones only.");
    m.def("sorted_union", &sorted_union, py::arg("a"), py::arg("b"),
          "The sorted union of two strictly increasing index arrays (a linear merge).");
    m.def("simd_level", &gtopk::cpu::simd_level,
          "Vector paths of the CPU kernels: 'avx512', 'avx2' or 'scalar' (float32 top-k and "
          "float32/int32 merge; other types run scalar loops).");
    bind_types(m);
#ifdef GTOPK_WITH_CUDA
    m.attr("built_with_cuda") = true;
    bind_cuda(m);
#else
    m.attr("built_with_cuda") = false;
#endif
}
