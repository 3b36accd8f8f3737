// The CPU entries of gtopk_hvd._C (the convention: bindings.h): host addresses, type codes, and
// the GIL released around each kernel (gtopk/cpu_ops.h).
#include <pybind11/numpy.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "bindings.h"
#include "gtopk/cpu_ops.h"
#include "gtopk/histogram_bins.h"
#include "gtopk/segments.h"
#include "gtopk/type_dispatch.h"
#include "gtopk/types.h"

namespace gtopk::bindings {
namespace {

constexpr const char* kScope = "gtopk::cpu::";

// A numpy array of the n indices a threshold selection found.
template <typename Index> py::array_t<Index> index_array(const std::vector<Index>& selected) {
    py::array_t<Index> indices(static_cast<py::ssize_t>(selected.size()));
    std::copy(selected.begin(), selected.end(), indices.mutable_data());
    return indices;
}

void bind_selection(py::module_& m) {
    m.def("topk_abs", [](ValueType value_type, IndexType index_type, Address x, int64_t d,
                         int64_t k, Address threshold_hint, Address out_index,
                         Address out_value) {
        require_index_fits(index_type, d);
        return with_types<true>(value_type, index_type, kScope, "topk_abs",
                                [&](auto value, auto index) {
            using T = decltype(value);
            using Index = decltype(index);
            py::gil_scoped_release release;
            return cpu::topk_abs<T, Index>(as_pointer<const T>(x), d, k,
                                           as_pointer<const T>(threshold_hint),
                                           as_pointer<Index>(out_index), as_pointer<T>(out_value));
        });
    }, py::arg("value_type"), py::arg("index_type"), py::arg("x"), py::arg("d"), py::arg("k"),
       py::arg("threshold_hint"), py::arg("out_index"), py::arg("out_value"),
       "Top-min(k, d) of x by magnitude into out_index / out_value; returns their count.");
    m.def("accumulate_select", [](ValueType value_type, IndexType index_type, Address gradient,
                                  Address residual, int64_t d, int64_t k,
                                  Address threshold_hint, Address out_index,
                                  Address out_value, bool clear_gradient) {
        require_index_fits(index_type, d);
        return with_types<false>(value_type, index_type, kScope, "accumulate_select",
                                 [&](auto value, auto index) {
            using T = decltype(value);
            using Index = decltype(index);
            py::gil_scoped_release release;
            return cpu::accumulate_select<T, Index>(
                as_pointer<T>(gradient), as_pointer<T>(residual), d, k,
                as_pointer<const T>(threshold_hint), as_pointer<Index>(out_index),
                as_pointer<T>(out_value), clear_gradient);
        });
    }, py::arg("value_type"), py::arg("index_type"), py::arg("gradient"), py::arg("residual"),
       py::arg("d"), py::arg("k"), py::arg("threshold_hint"), py::arg("out_index"),
       py::arg("out_value"), py::arg("clear_gradient"),
       "residual += gradient; its top-k into out_index / out_value; residual there = 0.");
    m.def("segment_table", [](Address offsets, Address ks, int64_t segments, int64_t d,
                              Address out) {
        const auto* offset_values = as_pointer<const int64_t>(offsets);
        const auto* k_values = as_pointer<const int64_t>(ks);
        check_segments(offset_values, k_values, segments, d);
        const std::vector<int64_t> table = segment_table(offset_values, k_values, segments);
        std::copy(table.begin(), table.end(), as_pointer<int64_t>(out));
    }, py::arg("offsets"), py::arg("ks"), py::arg("segments"), py::arg("d"), py::arg("out"),
       "The segments' table (gtopk/segments.h, SEGMENT_TABLE_ROWS x (segments + 1) int64) into "
       "out, the segments checked for a vector of d values.");
    m.def("segmented_accumulate_select", [](ValueType value_type, IndexType index_type,
                                            Address gradient, Address residual, int64_t d,
                                            Address offsets, Address ks, int64_t segments,
                                            Address out_index, Address out_value,
                                            bool clear_gradient) {
        require_index_fits(index_type, d);
        const auto* offset_values = as_pointer<const int64_t>(offsets);
        const auto* k_values = as_pointer<const int64_t>(ks);
        check_segments(offset_values, k_values, segments, d);
        return with_types<false>(value_type, index_type, kScope, "segmented_accumulate_select",
                                 [&](auto value, auto index) {
            using T = decltype(value);
            using Index = decltype(index);
            py::gil_scoped_release release;
            return cpu::segmented_accumulate_select<T, Index>(
                as_pointer<T>(gradient), as_pointer<T>(residual), offset_values, k_values,
                segments, as_pointer<Index>(out_index), as_pointer<T>(out_value),
                clear_gradient && gradient != 0);
        });
    }, py::arg("value_type"), py::arg("index_type"), py::arg("gradient"), py::arg("residual"),
       py::arg("d"), py::arg("offsets"), py::arg("ks"), py::arg("segments"),
       py::arg("out_index"), py::arg("out_value"), py::arg("clear_gradient"),
       "accumulate_select of each segment (gradient 0: none); returns the entries written.");
}

void bind_threshold(py::module_& m) {
    m.def("accumulate_threshold", [](ValueType value_type, IndexType index_type,
                                     Address gradient, Address residual, int64_t d,
                                     int64_t begin, int64_t end, uint64_t threshold_key,
                                     uint64_t histogram_base_key, int histogram_shift,
                                     int64_t n_bins, int64_t n_fine, int coarse_shift,
                                     bool clear_gradient, Address histogram) {
        require_index_fits(index_type, d);
        check_histogram_arguments(n_bins, n_fine, histogram_shift, coarse_shift);
        return with_types<false>(value_type, index_type, kScope, "accumulate_threshold",
                                 [&](auto value, auto index) -> py::array {
            using T = decltype(value);
            using Index = decltype(index);
            using Key = MagnitudeKey<T>;
            check_keys_fit<Key>(threshold_key, histogram_base_key);
            std::vector<Index> selected;
            {
                py::gil_scoped_release release;
                cpu::accumulate_threshold<T, Index>(
                    as_pointer<T>(gradient), as_pointer<T>(residual), d, begin, end,
                    static_cast<Key>(threshold_key), static_cast<Key>(histogram_base_key),
                    histogram_shift, n_bins, as_pointer<int64_t>(histogram),
                    clear_gradient && gradient != 0, selected, n_fine, coarse_shift);
            }
            return index_array(selected);
        });
    }, py::arg("value_type"), py::arg("index_type"), py::arg("gradient"), py::arg("residual"),
       py::arg("d"), py::arg("begin"), py::arg("end"), py::arg("threshold_key"),
       py::arg("histogram_base_key"), py::arg("histogram_shift"), py::arg("n_bins"),
       py::arg("n_fine"), py::arg("coarse_shift"), py::arg("clear_gradient"),
       py::arg("histogram"),
       "residual += gradient (gradient 0: none); the histogram (n_bins int64) into histogram; "
       "returns the selected indices.");
    m.def("threshold_indices", [](ValueType value_type, IndexType index_type, Address x,
                                  int64_t d, int64_t begin, int64_t end, uint64_t threshold_key) {
        require_index_fits(index_type, d);
        return with_types<false>(value_type, index_type, kScope, "threshold_indices",
                                 [&](auto value, auto index) -> py::array {
            using T = decltype(value);
            using Index = decltype(index);
            using Key = MagnitudeKey<T>;
            check_keys_fit<Key>(threshold_key);
            std::vector<Index> selected;
            {
                py::gil_scoped_release release;
                cpu::threshold_indices<T, Index>(as_pointer<const T>(x), begin, end,
                                                 static_cast<Key>(threshold_key), selected);
            }
            return index_array(selected);
        });
    }, py::arg("value_type"), py::arg("index_type"), py::arg("x"), py::arg("d"),
       py::arg("begin"), py::arg("end"), py::arg("threshold_key"),
       "The indices in [begin, end) whose magnitude key is >= threshold_key, sorted.");
    m.def("max_key", [](ValueType value_type, Address x, Address y, int64_t n,
                        bool finite_only) {
        return with_value_type<true>(value_type, kScope, "max_key", [&](auto value) {
            using T = decltype(value);
            if constexpr (!std::is_floating_point_v<T>) {
                if (y != 0) {
                    throw std::invalid_argument("max_key adds y to x for float32 / float64 only");
                }
            }
            py::gil_scoped_release release;
            return cpu::max_key<T>(as_pointer<const T>(x), as_pointer<const T>(y), n,
                                   finite_only);
        });
    }, py::arg("value_type"), py::arg("x"), py::arg("y"), py::arg("n"), py::arg("finite_only"),
       "The largest magnitude key of x (+ y; y = 0: none) over every value, or over the finite "
       "ones only.");
    m.def("read_pass", [](ValueType value_type, Address x, int64_t n) {
        return with_value_type<false>(value_type, kScope, "read_pass", [&](auto value) {
            using T = decltype(value);
            py::gil_scoped_release release;
            return cpu::read_pass<T>(as_pointer<const T>(x), n);
        });
    }, py::arg("value_type"), py::arg("x"), py::arg("n"),
       "Benchmark floor: one multi-threaded read of x (returns its largest magnitude key).");
}

void bind_sets(py::module_& m) {
    m.def("first_not_increasing", [](IndexType index_type, Address index, int64_t n) {
        return with_index_type(index_type, kScope, "first_not_increasing", [&](auto tag) {
            using Index = decltype(tag);
            py::gil_scoped_release release;
            return cpu::first_not_increasing<Index>(as_pointer<const Index>(index), n);
        });
    }, py::arg("index_type"), py::arg("index"), py::arg("n"),
       "The first j in [1, n) with index[j] <= index[j - 1]; 0 when strictly increasing.");
    m.def("merge_topk", [](ValueType value_type, IndexType index_type, Address index_a,
                           Address value_a, int64_t n_a, Address index_b, Address value_b,
                           int64_t n_b, int64_t k, Address out_index, Address out_value) {
        return with_types<false>(value_type, index_type, kScope, "merge_topk",
                                 [&](auto value, auto index) {
            using T = decltype(value);
            using Index = decltype(index);
            py::gil_scoped_release release;
            return cpu::merge_topk<T, Index>(
                as_pointer<const Index>(index_a), as_pointer<const T>(value_a), n_a,
                as_pointer<const Index>(index_b), as_pointer<const T>(value_b), n_b, k,
                as_pointer<Index>(out_index), as_pointer<T>(out_value));
        });
    }, py::arg("value_type"), py::arg("index_type"), py::arg("index_a"), py::arg("value_a"),
       py::arg("n_a"), py::arg("index_b"), py::arg("value_b"), py::arg("n_b"), py::arg("k"),
       py::arg("out_index"), py::arg("out_value"),
       "Top-k of the union of two index-sorted sets, values summed; returns the entries written.");
    m.def("write_sparse", [](ValueType value_type, IndexType index_type, Address dest,
                             int64_t d, Address index, Address value, int64_t n) {
        with_types<false>(value_type, index_type, kScope, "write_sparse",
                          [&](auto value_tag, auto index_tag) {
            using T = decltype(value_tag);
            using Index = decltype(index_tag);
            py::gil_scoped_release release;
            cpu::write_sparse<T, Index>(as_pointer<T>(dest), d, as_pointer<const Index>(index),
                                        as_pointer<const T>(value), n);
        });
    }, py::arg("value_type"), py::arg("index_type"), py::arg("dest"), py::arg("d"),
       py::arg("index"), py::arg("value"), py::arg("n"),
       "dest = 0 except dest[index] = value, in one pass.");
    m.def("restore_residual", [](ValueType value_type, IndexType index_type, Address residual,
                                 int64_t d, Address index, Address value, Address restore,
                                 int64_t n) {
        with_types<false>(value_type, index_type, kScope, "restore_residual",
                          [&](auto value_tag, auto index_tag) {
            using T = decltype(value_tag);
            using Index = decltype(index_tag);
            py::gil_scoped_release release;
            cpu::restore_residual<T, Index>(as_pointer<T>(residual), d,
                                            as_pointer<const Index>(index),
                                            as_pointer<const T>(value),
                                            as_pointer<const uint8_t>(restore), n);
        });
    }, py::arg("value_type"), py::arg("index_type"), py::arg("residual"), py::arg("d"),
       py::arg("index"), py::arg("value"), py::arg("restore"), py::arg("n"),
       "residual[index[j]] += value[j] where restore[j] (uint8) is nonzero.");
    m.def("mark_survivors", [](IndexType index_type, Address local_index, int64_t n_local,
                               Address global_index, int64_t n_global, Address survived) {
        with_index_type(index_type, kScope, "mark_survivors", [&](auto tag) {
            using Index = decltype(tag);
            py::gil_scoped_release release;
            cpu::mark_survivors<Index>(as_pointer<const Index>(local_index), n_local,
                                       as_pointer<const Index>(global_index), n_global,
                                       as_pointer<uint8_t>(survived));
        });
    }, py::arg("index_type"), py::arg("local_index"), py::arg("n_local"),
       py::arg("global_index"), py::arg("n_global"), py::arg("survived"),
       "survived[j] (uint8) = local_index[j] is in the sorted global_index.");
    m.def("sorted_union", [](IndexType index_type, Address a, int64_t n_a, Address b,
                             int64_t n_b, Address out) {
        return with_index_type(index_type, kScope, "sorted_union", [&](auto tag) {
            using Index = decltype(tag);
            py::gil_scoped_release release;
            return cpu::sorted_union<Index>(as_pointer<const Index>(a), n_a,
                                            as_pointer<const Index>(b), n_b,
                                            as_pointer<Index>(out));
        });
    }, py::arg("index_type"), py::arg("a"), py::arg("n_a"), py::arg("b"), py::arg("n_b"),
       py::arg("out"),
       "The sorted union of two strictly increasing index arrays into out (n_a + n_b entries); "
       "returns its length.");
}

void bind_sketch(py::module_& m) {
    m.def("sketch_table", [](Address gradient, Address residual, int64_t d, Address keys,
                             int64_t rows, int64_t columns, bool clear_gradient,
                             Address table) {
        check_sketch_shape(rows, columns);
        py::gil_scoped_release release;
        cpu::sketch_table(as_pointer<float>(gradient), as_pointer<float>(residual), d,
                          as_pointer<const uint32_t>(keys), static_cast<int>(rows), columns,
                          clear_gradient && gradient != 0, as_pointer<float>(table));
    }, py::arg("gradient"), py::arg("residual"), py::arg("d"), py::arg("keys"), py::arg("rows"),
       py::arg("columns"), py::arg("clear_gradient"), py::arg("table"),
       "residual += gradient (gradient 0: none); the count sketch of the residual into table "
       "(rows x columns float32).");
    m.def("sketch_select", [](Address table, Address keys, int64_t rows, int64_t columns,
                              int64_t d, int64_t k, Address estimate, IndexType index_type,
                              Address out_index, Address out_value) {
        check_sketch_shape(rows, columns);
        require_index_fits(index_type, d);
        return with_index_type(index_type, kScope, "sketch_select", [&](auto tag) {
            using Index = decltype(tag);
            py::gil_scoped_release release;
            return cpu::sketch_select<Index>(as_pointer<const float>(table),
                                             as_pointer<const uint32_t>(keys),
                                             static_cast<int>(rows), columns, d, k,
                                             as_pointer<float>(estimate),
                                             as_pointer<Index>(out_index),
                                             as_pointer<float>(out_value));
        });
    }, py::arg("table"), py::arg("keys"), py::arg("rows"), py::arg("columns"), py::arg("d"),
       py::arg("k"), py::arg("estimate"), py::arg("index_type"), py::arg("out_index"),
       py::arg("out_value"),
       "The top-k of the sketch's estimates of d entries into out_index / out_value; estimate: "
       "a buffer of d float32 filled with them, or 0 (none are stored).");
}

}  // namespace

void bind_cpu(py::module_& m) {
    bind_selection(m);
    bind_threshold(m);
    bind_sets(m);
    bind_sketch(m);
    m.def("set_num_threads", &cpu::set_max_threads, py::arg("n"),
          "Threads of the CPU kernels; 0: OpenMP's default (OMP_NUM_THREADS).");
    m.def("get_num_threads", &cpu::max_threads);
    m.def("simd_level", &cpu::simd_level,
          "Vector paths of the CPU kernels: 'avx512', 'avx2' or 'scalar' (float32 top-k and "
          "float32/int32 merge; other types run scalar loops).");
}

}  // namespace gtopk::bindings
