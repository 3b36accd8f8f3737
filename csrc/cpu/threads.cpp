// The thread count of the CPU kernels, settable at run time (gtopk_hvd/threads.py sizes it by
// the cores each local rank has). A plain int per process, not OpenMP's per-thread ICV, so that
// it holds for kernels called from any thread (Python threads, tf.py_function).
#include <omp.h>

#include <algorithm>
#include <atomic>

#include "gtopk/cpu_ops.h"

namespace gtopk::cpu {
namespace {
std::atomic<int> configured_threads{0};
}  // namespace

void set_max_threads(int n) { configured_threads.store(std::max(0, n)); }

int max_threads() {
    const int n = configured_threads.load(std::memory_order_relaxed);
    return n > 0 ? n : omp_get_max_threads();
}

}  // namespace gtopk::cpu
