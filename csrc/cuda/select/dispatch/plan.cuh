// Host side: the digit schedule of d values and the plan of a selection (gtopk/select_engine.cuh
// declares SelectPlan, plan_select and select_bytes_bound).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cub/device/device_radix_sort.cuh>
#include <type_traits>

#include "../../cuda_check.cuh"
#include "../../device.cuh"
#include "gtopk/select_engine.cuh"
#include "../tuning.cuh"

namespace gtopk::cuda::detail {

constexpr int kDigitBits = 11;
constexpr int kMaxLevels = 16;
constexpr int64_t kSmallInput = int64_t{1} << 16;
constexpr int64_t kSampleSize = int64_t{1} << 16;
constexpr int64_t kGuessMaxFraction = 16;
constexpr int64_t kCapacitySlack = int64_t{1} << 16;

struct Schedule {
    Level level[kMaxLevels];
    int count;
};

template <typename T> Schedule make_schedule(int64_t d) {
    Schedule schedule{};
    auto add = [&schedule](int on_key, int top, int width) {
        schedule.level[schedule.count++] = Level{on_key, top - width, width};
    };
    int top = KeyLayout<T>::kKeyBits;
    add(1, top, KeyLayout<T>::kFirstDigit);
    top -= KeyLayout<T>::kFirstDigit;
    for (; top > 0; top -= std::min(top, kDigitBits)) add(1, top, std::min(top, kDigitBits));
    int index_bits = 0;
    while (index_bits < 63 && (static_cast<uint64_t>(d - 1) >> index_bits) != 0) ++index_bits;
    for (top = index_bits; top > 0; top -= std::min(top, kDigitBits)) {
        add(0, top, std::min(top, kDigitBits));
    }
    return schedule;
}

template <typename T> using BitsOf = KeyOf<T>;  // unsigned integer of T's width
template <typename Index> using UnsignedOf = std::make_unsigned_t<Index>;

template <typename T, typename Index> void SelectPlan<T, Index>::lay_out() {
    Layout layout;
    at_state = layout.add<SelectState>(1);
    at_histogram = layout.add<u64>(kMaxBins<T>);
    at_sample_histogram = layout.add<u64>(kMaxBins<T>);
    at_buffer_index = layout.add<Index>(capacity);
    at_buffer_value = layout.add<T>(capacity);
    at_stage_index = layout.add<Index>(n);
    at_stage_value = layout.add<T>(n);
    at_sort = layout.add<char>(static_cast<int64_t>(sort_bytes));
    bytes = layout.bytes();
}

template <typename T, typename Index> SelectPlan<T, Index> plan_select(int64_t d, int64_t n) {
    SelectPlan<T, Index> plan{};
    plan.d = d;
    plan.n = n;
    const bool guessable = n * kGuessMaxFraction <= d && d > kSmallInput;
    plan.samples = std::min(kSampleSize, d);
    plan.stride = d / plan.samples;
    const double expected = static_cast<double>(n) * plan.samples / d;
    plan.sample_rank =
        1 + static_cast<int64_t>(std::ceil(expected + 4.0 * std::sqrt(expected) + 4.0));
    plan.guess = guessable && plan.sample_rank <= plan.samples;
    plan.capacity = std::min(
        d, std::max(2 * n, plan.guess ? 2 * plan.sample_rank * plan.stride : 0) + kCapacitySlack);

    const u64 last = static_cast<u64>(d - 1);
    plan.end_bit = 1;
    while (plan.end_bit < 64 && (last >> plan.end_bit) != 0) ++plan.end_bit;
    using UIndex = UnsignedOf<Index>;
    using Bits = BitsOf<T>;
    check_cuda(cub::DeviceRadixSort::SortPairs(
                   nullptr, plan.sort_bytes, static_cast<const UIndex*>(nullptr),
                   static_cast<UIndex*>(nullptr), static_cast<const Bits*>(nullptr),
                   static_cast<Bits*>(nullptr), n, 0, plan.end_bit),
               "cub::DeviceRadixSort::SortPairs (size query)", __FILE__, __LINE__);
    plan.lay_out();
    return plan;
}

// Workspace bytes enough for select_topk over any d' <= d values with any n' <= n: the plan for
// (d, n) with the buffer at the largest capacity any plan can have, d.
template <typename T, typename Index> size_t select_bytes_bound(int64_t d, int64_t n) {
    SelectPlan<T, Index> plan = plan_select<T, Index>(d, n);
    plan.capacity = d;
    plan.lay_out();
    return plan.bytes;
}

}  // namespace gtopk::cuda::detail
