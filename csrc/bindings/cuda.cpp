// The CUDA entries of gtopk_hvd._C (the convention: bindings.h): device addresses, type codes,
// the stream as an address (0: the legacy default stream), and the workspace as an address and
// its bytes (0: the cached one, gtopk/cuda_ops.h); gtopk_hvd/ops/ allocates the outputs and
// passes the current stream. Built only with the CUDA kernels.
#include <cstdint>

#include "bindings.h"
#include "gtopk/count_sketch.h"
#include "gtopk/cuda_ops.h"
#include "gtopk/histogram_bins.h"
#include "gtopk/segments.h"
#include "gtopk/types.h"

namespace gtopk::bindings {

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
    m.def("cuda_topk_abs", [](ValueType value_type, IndexType index_type, Address x, int64_t d,
                              int64_t k, Address out_index, Address out_value,
                              uintptr_t stream, Address workspace, size_t workspace_bytes) {
        py::gil_scoped_release release;
        return gtopk::cuda::topk_abs(value_type, index_type, as_pointer(x), d, k,
                                     as_pointer(out_index), as_pointer(out_value),
                                     as_pointer(stream),
                                     Workspace{as_pointer(workspace), workspace_bytes});
    }, py::arg("value_type"), py::arg("index_type"), py::arg("x"), py::arg("d"), py::arg("k"),
       py::arg("out_index"), py::arg("out_value"), py::arg("stream"), py::arg("workspace"),
       py::arg("workspace_bytes"));
    m.def("cuda_accumulate_select", [](ValueType value_type, IndexType index_type,
                                       Address gradient, Address residual, int64_t d,
                                       int64_t k, Address out_index, Address out_value,
                                       uintptr_t stream, Address workspace,
                                       size_t workspace_bytes, Address skip) {
        py::gil_scoped_release release;
        return gtopk::cuda::accumulate_select(
            value_type, index_type, as_pointer(gradient), as_pointer(residual), d, k,
            as_pointer(out_index), as_pointer(out_value), as_pointer(stream),
            Workspace{as_pointer(workspace), workspace_bytes},
            static_cast<const int32_t*>(as_pointer(skip)));
    }, py::arg("value_type"), py::arg("index_type"), py::arg("gradient"), py::arg("residual"),
       py::arg("d"), py::arg("k"), py::arg("out_index"), py::arg("out_value"), py::arg("stream"),
       py::arg("workspace"), py::arg("workspace_bytes"), py::arg("skip"));
    m.def("cuda_segmented_select_workspace_bytes", [](ValueType value_type,
                                                      IndexType index_type, Address table,
                                                      int64_t segments) {
        return gtopk::cuda::segmented_select_workspace_bytes(
            value_type, index_type, as_pointer<const int64_t>(table), segments);
    }, py::arg("value_type"), py::arg("index_type"), py::arg("table"), py::arg("segments"),
          "Workspace bytes of cuda_segmented_accumulate_select (table: segment_table's, in host "
          "memory).");
    m.def("cuda_segmented_accumulate_select", [](ValueType value_type, IndexType index_type,
                                                 Address gradient, Address residual,
                                                 int64_t d, Address table,
                                                 Address device_table, int64_t segments,
                                                 bool clear_gradient,
                                                 Address out_index, Address out_value,
                                                 uintptr_t stream, Address workspace,
                                                 size_t workspace_bytes, Address skip) {
        const auto* host_table = as_pointer<const int64_t>(table);
        py::gil_scoped_release release;
        return gtopk::cuda::segmented_accumulate_select(
            value_type, index_type, as_pointer(gradient), as_pointer(residual), d, host_table,
            static_cast<const int64_t*>(as_pointer(device_table)), segments,
            as_pointer(out_index), as_pointer(out_value), clear_gradient, as_pointer(stream),
            Workspace{as_pointer(workspace), workspace_bytes},
            static_cast<const int32_t*>(as_pointer(skip)));
    }, py::arg("value_type"), py::arg("index_type"), py::arg("gradient"), py::arg("residual"),
       py::arg("d"), py::arg("table"), py::arg("device_table"), py::arg("segments"),
       py::arg("clear_gradient"), py::arg("out_index"), py::arg("out_value"), py::arg("stream"),
       py::arg("workspace"), py::arg("workspace_bytes"), py::arg("skip"));
    m.def("cuda_merge_topk", [](ValueType value_type, IndexType index_type, Address index_a,
                                Address value_a, int64_t n_a, Address index_b,
                                Address value_b, int64_t n_b, int64_t k, Address out_index,
                                Address out_value, uintptr_t stream, Address workspace,
                                size_t workspace_bytes) {
        py::gil_scoped_release release;
        return gtopk::cuda::merge_topk(value_type, index_type, as_pointer(index_a),
                                       as_pointer(value_a), n_a, as_pointer(index_b),
                                       as_pointer(value_b), n_b, k, as_pointer(out_index),
                                       as_pointer(out_value), as_pointer(stream),
                                       Workspace{as_pointer(workspace), workspace_bytes});
    }, py::arg("value_type"), py::arg("index_type"), py::arg("index_a"), py::arg("value_a"),
       py::arg("n_a"), py::arg("index_b"), py::arg("value_b"), py::arg("n_b"), py::arg("k"),
       py::arg("out_index"), py::arg("out_value"), py::arg("stream"), py::arg("workspace"),
       py::arg("workspace_bytes"));
    m.def("cuda_accumulate_count_workspace_bytes", &gtopk::cuda::accumulate_count_workspace_bytes,
          py::arg("n_bins"));
    m.def("cuda_accumulate_count", [](ValueType value_type, Address gradient,
                                      Address residual, int64_t d, int64_t begin, int64_t end,
                                      uint64_t threshold_key, uint64_t histogram_base_key,
                                      int histogram_shift, int64_t n_bins, int64_t n_fine,
                                      int coarse_shift, bool clear_gradient, uintptr_t stream,
                                      Address workspace, size_t workspace_bytes,
                                      Address histogram, Address device_counts) {
        gtopk::check_histogram_arguments(n_bins, n_fine, histogram_shift, coarse_shift);
        py::gil_scoped_release release;
        return gtopk::cuda::accumulate_count(
            value_type, as_pointer(gradient), as_pointer(residual), d, begin, end, threshold_key,
            histogram_base_key, histogram_shift, n_bins, n_fine, coarse_shift, clear_gradient,
            as_pointer<int64_t>(histogram), as_pointer(stream),
            Workspace{as_pointer(workspace), workspace_bytes},
            static_cast<int64_t*>(as_pointer(device_counts)));
    }, "The count at or above the threshold, the histogram into histogram (n_bins int64, host "
       "memory): cpu accumulate_threshold's first half; with device_counts (n_bins + 1 int64 on "
       "the device) both are left there (histogram 0, returns -1), no wait.",
       py::arg("value_type"), py::arg("gradient"), py::arg("residual"), py::arg("d"),
       py::arg("begin"), py::arg("end"), py::arg("threshold_key"), py::arg("histogram_base_key"),
       py::arg("histogram_shift"), py::arg("n_bins"), py::arg("n_fine"), py::arg("coarse_shift"),
       py::arg("clear_gradient"), py::arg("stream"), py::arg("workspace"),
       py::arg("workspace_bytes"), py::arg("histogram"), py::arg("device_counts") = 0);
    m.def("cuda_threshold_indices_workspace_bytes",
          &gtopk::cuda::threshold_indices_workspace_bytes, py::arg("value_type"),
          py::arg("index_type"), py::arg("n"));
    m.def("cuda_threshold_indices", [](ValueType value_type, IndexType index_type, Address x,
                                       int64_t d, int64_t begin, int64_t end,
                                       uint64_t threshold_key, Address out_index,
                                       int64_t capacity, uintptr_t stream, Address workspace,
                                       size_t workspace_bytes, Address device_count) {
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
    m.def("cuda_sketch_table_workspace_bytes", [](int64_t rows, int64_t columns,
                                                  int64_t tile_columns) {
        check_sketch_shape(rows, columns);
        return gtopk::cuda::sketch_table_workspace_bytes(static_cast<int>(rows), columns,
                                                         tile_columns);
    }, py::arg("rows"), py::arg("columns"), py::arg("tile_columns") = 0,
       "Workspace bytes of cuda_sketch_table.");
    m.def("cuda_sketch_table", [](Address gradient, Address residual, int64_t d,
                                  Address keys, int64_t rows, int64_t columns,
                                  bool clear_gradient, Address table, uintptr_t stream,
                                  Address workspace, size_t workspace_bytes,
                                  int64_t tile_columns, Address skip) {
        check_sketch_shape(rows, columns);
        const auto* key_words = as_pointer<const uint32_t>(keys);
        py::gil_scoped_release release;
        gtopk::cuda::sketch_table(static_cast<float*>(as_pointer(gradient)),
                                  static_cast<float*>(as_pointer(residual)), d, key_words,
                                  static_cast<int>(rows), columns, clear_gradient,
                                  static_cast<float*>(as_pointer(table)),
                                  as_pointer(stream),
                                  Workspace{as_pointer(workspace), workspace_bytes},
                                  tile_columns, static_cast<const int32_t*>(as_pointer(skip)));
    }, py::arg("gradient"), py::arg("residual"), py::arg("d"), py::arg("keys"),
       py::arg("rows"), py::arg("columns"), py::arg("clear_gradient"), py::arg("table"),
       py::arg("stream"),
       py::arg("workspace"), py::arg("workspace_bytes"), py::arg("tile_columns") = 0,
       py::arg("skip") = 0);
    m.def("cuda_sketch_select_workspace_bytes", [](IndexType index_type, int64_t d, int64_t k,
                                                   int64_t rows, int64_t columns) {
        if (rows == 0) {  // the selection without the row bitmaps (what callers before them asked)
            return gtopk::cuda::select_workspace_bytes(gtopk::ValueType::kFloat32,
                                                       index_type, d, k);
        }
        check_sketch_shape(rows, columns);
        return gtopk::cuda::sketch_select_workspace_bytes(index_type, d, k,
                                                          static_cast<int>(rows), columns);
    }, py::arg("index_type"), py::arg("d"), py::arg("k"), py::arg("rows") = 0,
       py::arg("columns") = 0,
       "Workspace bytes of cuda_sketch_select: with the rows and columns, room for the row "
       "bitmaps of its pass 1; without (rows 0), the selection reads every estimate.");
    m.def("cuda_sketch_select", [](Address table, Address keys, int64_t rows,
                                   int64_t columns, int64_t d, int64_t k, IndexType index_type,
                                   Address out_index, Address out_value, uintptr_t stream,
                                   Address workspace, size_t workspace_bytes) {
        check_sketch_shape(rows, columns);
        const auto* key_words = as_pointer<const uint32_t>(keys);
        py::gil_scoped_release release;
        return gtopk::cuda::sketch_select(static_cast<const float*>(as_pointer(table)), key_words,
                                          static_cast<int>(rows), columns, d, k, index_type,
                                          as_pointer(out_index),
                                          static_cast<float*>(as_pointer(out_value)),
                                          as_pointer(stream),
                                          Workspace{as_pointer(workspace), workspace_bytes});
    }, py::arg("table"), py::arg("keys"), py::arg("rows"), py::arg("columns"), py::arg("d"),
       py::arg("k"), py::arg("index_type"), py::arg("out_index"), py::arg("out_value"),
       py::arg("stream"), py::arg("workspace"), py::arg("workspace_bytes"),
       "The top-k of the sketch's estimates, computed inside the selection (no estimate buffer).");
    m.def("cuda_sketch_estimate", [](Address table, Address keys, int64_t rows,
                                     int64_t columns, int64_t d, Address estimate,
                                     uintptr_t stream) {
        check_sketch_shape(rows, columns);
        const auto* key_words = as_pointer<const uint32_t>(keys);
        py::gil_scoped_release release;
        gtopk::cuda::sketch_estimate(static_cast<const float*>(as_pointer(table)), key_words,
                                     static_cast<int>(rows), columns, d,
                                     static_cast<float*>(as_pointer(estimate)),
                                     as_pointer(stream));
    }, py::arg("table"), py::arg("keys"), py::arg("rows"), py::arg("columns"), py::arg("d"),
       py::arg("estimate"), py::arg("stream"));
    m.def("cuda_max_key_workspace_bytes", &gtopk::cuda::max_key_workspace_bytes,
          py::arg("value_type"), py::arg("n"));
    m.def("cuda_max_key", [](ValueType value_type, Address x, Address y, int64_t n,
                             bool finite_only, uintptr_t stream, Address workspace,
                             size_t workspace_bytes) {
        py::gil_scoped_release release;
        return gtopk::cuda::max_key(value_type, as_pointer(x), as_pointer(y), n, finite_only,
                                    as_pointer(stream),
                                    Workspace{as_pointer(workspace), workspace_bytes});
    }, py::arg("value_type"), py::arg("x"), py::arg("y"), py::arg("n"), py::arg("finite_only"),
       py::arg("stream"), py::arg("workspace"), py::arg("workspace_bytes"),
       "The largest magnitude key of x (+ y; y = 0: none), finite values only if asked.");
    m.def("cuda_mark_nonfinite", [](ValueType value_type, Address x, int64_t n, Address flag,
                                    uintptr_t stream, Address workspace,
                                    size_t workspace_bytes) {
        py::gil_scoped_release release;
        gtopk::cuda::mark_nonfinite(value_type, as_pointer(x), n,
                                    static_cast<int32_t*>(as_pointer(flag)), as_pointer(stream),
                                    Workspace{as_pointer(workspace), workspace_bytes});
    }, py::arg("value_type"), py::arg("x"), py::arg("n"), py::arg("flag"), py::arg("stream"),
       py::arg("workspace"), py::arg("workspace_bytes"),
       "*flag = 1 if x holds a NaN or Inf, enqueued on the stream (no host wait).");
    m.def("cuda_momentum_update", [](ValueType value_type, Address velocity,
                                     Address gradient, int64_t n, double momentum,
                                     double divisor, uintptr_t stream, Address skip) {
        py::gil_scoped_release release;
        gtopk::cuda::momentum_update(value_type, as_pointer(velocity), as_pointer(gradient), n,
                                     momentum, divisor, as_pointer(stream),
                                     static_cast<const int32_t*>(as_pointer(skip)));
    }, py::arg("value_type"), py::arg("velocity"), py::arg("gradient"), py::arg("n"),
       py::arg("momentum"), py::arg("divisor"), py::arg("stream"), py::arg("skip"),
       "velocity = momentum * velocity + gradient / divisor in one pass (no host wait).");
    m.def("cuda_restore_residual", [](ValueType value_type, IndexType index_type,
                                      Address residual, Address index, Address value,
                                      Address restore, int64_t n, uintptr_t stream) {
        py::gil_scoped_release release;
        gtopk::cuda::restore_residual(value_type, index_type, as_pointer(residual),
                                      as_pointer(index), as_pointer(value),
                                      static_cast<const uint8_t*>(as_pointer(restore)), n,
                                      as_pointer(stream));
    }, py::arg("value_type"), py::arg("index_type"), py::arg("residual"), py::arg("index"),
       py::arg("value"), py::arg("restore"), py::arg("n"), py::arg("stream"));
    m.def("cuda_restore_unselected", [](ValueType value_type, IndexType index_type,
                                        Address residual, Address index, Address value,
                                        int64_t n, Address selected, int64_t n_selected,
                                        uintptr_t stream, Address skip) {
        py::gil_scoped_release release;
        gtopk::cuda::restore_unselected(value_type, index_type, as_pointer(residual),
                                        as_pointer(index), as_pointer(value), n,
                                        as_pointer(selected), n_selected, as_pointer(stream),
                                        static_cast<const int32_t*>(as_pointer(skip)));
    }, py::arg("value_type"), py::arg("index_type"), py::arg("residual"), py::arg("index"),
       py::arg("value"), py::arg("n"), py::arg("selected"), py::arg("n_selected"),
       py::arg("stream"), py::arg("skip"),
       "residual[index[j]] += value[j] where index[j] is not in the sorted `selected`.");
    m.def("cuda_zero_at", [](ValueType value_type, IndexType index_type, Address x,
                             Address index, int64_t n, uintptr_t stream, Address skip) {
        py::gil_scoped_release release;
        gtopk::cuda::zero_at(value_type, index_type, as_pointer(x), as_pointer(index), n,
                             as_pointer(stream), static_cast<const int32_t*>(as_pointer(skip)));
    }, py::arg("value_type"), py::arg("index_type"), py::arg("x"), py::arg("index"), py::arg("n"),
       py::arg("stream"), py::arg("skip"),
       "x[index] = 0 unless the skip flag is set.");
    m.def("cuda_take_at", [](ValueType value_type, IndexType index_type, Address residual,
                             Address index, int64_t n, Address taken_index,
                             Address taken_value, int64_t n_taken, Address out,
                             uintptr_t stream, Address skip) {
        py::gil_scoped_release release;
        gtopk::cuda::take_at(value_type, index_type, as_pointer(residual), as_pointer(index), n,
                             as_pointer(taken_index), as_pointer(taken_value), n_taken,
                             as_pointer(out), as_pointer(stream),
                             static_cast<const int32_t*>(as_pointer(skip)));
    }, py::arg("value_type"), py::arg("index_type"), py::arg("residual"), py::arg("index"),
       py::arg("n"), py::arg("taken_index"), py::arg("taken_value"), py::arg("n_taken"),
       py::arg("out"), py::arg("stream"), py::arg("skip"),
       "out = residual[index] (+ the taken values there); residual[index] = 0 unless skipped.");
    m.def("cuda_write_sparse", [](ValueType value_type, IndexType index_type, Address dest,
                                  int64_t d, Address index, Address value, int64_t n,
                                  bool zeroed, uintptr_t stream, Address skip) {
        py::gil_scoped_release release;
        gtopk::cuda::write_sparse(value_type, index_type, as_pointer(dest), d, as_pointer(index),
                                  as_pointer(value), n, zeroed, as_pointer(stream),
                                  static_cast<const int32_t*>(as_pointer(skip)));
    }, py::arg("value_type"), py::arg("index_type"), py::arg("dest"), py::arg("d"),
       py::arg("index"), py::arg("value"), py::arg("n"), py::arg("zeroed"), py::arg("stream"),
       py::arg("skip"),
       "dest = 0 except dest[index] = value (all NaN if the skip flag is set).");
}

}  // namespace gtopk::bindings
