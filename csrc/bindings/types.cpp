// The type codes and constants that the kernels and gtopk_hvd/ops/ share (types.h, segments.h,
// count_sketch.h), and the sketch's shape rule of both devices' entries.
#include <stdexcept>
#include <string>

#include "bindings.h"
#include "gtopk/count_sketch.h"
#include "gtopk/segments.h"
#include "gtopk/types.h"

namespace gtopk::bindings {

void check_sketch_shape(int64_t rows, int64_t columns) {
    if (rows < 1 || rows > sketch::kMaxRows) {
        throw std::invalid_argument("a count sketch has 1 to " + std::to_string(sketch::kMaxRows) +
                                    " rows, got " + std::to_string(rows));
    }
    if (columns < 1 || columns > sketch::kMaxColumns) {
        throw std::invalid_argument("a count sketch needs columns >= 1 and < 2^32, got " +
                                    std::to_string(columns));
    }
}

void bind_types(py::module_& m) {
    py::enum_<ValueType>(m, "ValueType", "Value dtype codes of the kernels (dtype names).")
        .value("float32", ValueType::kFloat32)
        .value("float64", ValueType::kFloat64)
        .value("float16", ValueType::kFloat16)
        .value("bfloat16", ValueType::kBFloat16);
    py::enum_<IndexType>(m, "IndexType", "Index dtype codes of the kernels (dtype names).")
        .value("int32", IndexType::kInt32)
        .value("int64", IndexType::kInt64);
    m.attr("INT32_INDEX_LIMIT") = kInt32IndexLimit;
    m.attr("SKETCH_MAX_ROWS") = sketch::kMaxRows;
    m.attr("SEGMENT_TABLE_ROWS") = kSegmentTableRows;
    m.def("int32_indices_fit", &int32_indices_fit, py::arg("d"),
          "True iff the indices 0 .. d-1 of a dense length d fit in int32 "
          "(d <= INT32_INDEX_LIMIT).");
    m.def("check_sketch_shape", &check_sketch_shape, py::arg("rows"), py::arg("columns"),
          "Raises ValueError unless 1 <= rows <= SKETCH_MAX_ROWS and 1 <= columns < 2^32.");
}

}  // namespace gtopk::bindings
