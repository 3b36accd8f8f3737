// The module gtopk_hvd._C (the convention of its entries: bindings.h).
#include "bindings.h"

PYBIND11_MODULE(_C, m) {
    m.doc() = "gtopk_hvd C++/CUDA kernels: exact top-k by magnitude, sparse merge, residuals";
    gtopk::bindings::bind_types(m);
    gtopk::bindings::bind_cpu(m);
#ifdef GTOPK_WITH_CUDA
    m.attr("built_with_cuda") = true;
    gtopk::bindings::bind_cuda(m);
#else
    m.attr("built_with_cuda") = false;
#endif
}
