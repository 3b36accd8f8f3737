// The order check of index sets (every sparse kernel's input contract): one multi-threaded read.
// Each block is tested by an OR over "index[j] <= index[j - 1]" with no early exit, a loop the
// compiler vectorises; only a block that fails is scanned again for its first bad position.
#include <omp.h>

#include <algorithm>
#include <limits>

#include "gtopk/cpu_ops.h"
#include "select_engine.h"

namespace gtopk::cpu {
namespace {

constexpr int64_t kCheckBlock = 4096;

// Whether index[j - 1] < index[j] for every j in [begin, end), begin >= 1.
template <typename Index> bool increasing(const Index* index, int64_t begin, int64_t end) {
    unsigned bad = 0;
    for (int64_t j = begin; j < end; ++j) bad |= index[j] <= index[j - 1];
    return bad == 0;
}

}  // namespace

template <typename Index> int64_t first_not_increasing(const Index* index, int64_t n) {
    const int64_t blocks = (std::max<int64_t>(n, 1) - 1 + kCheckBlock - 1) / kCheckBlock;
    int64_t first_bad_block = std::numeric_limits<int64_t>::max();
#pragma omp parallel for num_threads(detail::threads_for(n)) schedule(static) \
    reduction(min : first_bad_block)
    for (int64_t block = 0; block < blocks; ++block) {
        const int64_t begin = 1 + block * kCheckBlock;
        if (block < first_bad_block &&
            !increasing(index, begin, std::min(n, begin + kCheckBlock))) {
            first_bad_block = block;
        }
    }
    if (first_bad_block == std::numeric_limits<int64_t>::max()) return 0;
    for (int64_t j = 1 + first_bad_block * kCheckBlock;; ++j) {
        if (index[j] <= index[j - 1]) return j;
    }
}

template int64_t first_not_increasing<int32_t>(const int32_t*, int64_t);
template int64_t first_not_increasing<int64_t>(const int64_t*, int64_t);

}  // namespace gtopk::cpu
