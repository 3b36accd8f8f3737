// The read-only floor for benchmarks: one multi-threaded pass that reads every value once
// (the largest magnitude key) with the selection engine's own block loop, the least any exact
// top-k can do.
#include "gtopk/cpu_ops.h"
#include "select_engine.h"

namespace gtopk::cpu {

template <typename T> uint64_t read_pass(const T* x, int64_t d) {
    detail::ReadSource<T> source{x};
    std::vector<uint64_t> per_thread(detail::threads_for(d), 0);
    detail::for_each_block(source, d, [&](int thread, int64_t, const T* block, int64_t n) {
        per_thread[thread] = std::max<uint64_t>(per_thread[thread], detail::block_max_key(block, n));
        return true;
    });
    return *std::max_element(per_thread.begin(), per_thread.end());
}

template uint64_t read_pass<float>(const float*, int64_t);
template uint64_t read_pass<double>(const double*, int64_t);

}  // namespace gtopk::cpu
