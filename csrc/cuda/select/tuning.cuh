// The shape of the engine's passes and of the composite's first digit, shared by the agents
// (device side) and the dispatch layer (host side) of select/.
#pragma once

#include <cstdint>

#include "gtopk/magnitude_order.h"

namespace gtopk::cuda::detail {

constexpr int kThreads = 256;
// Entries per thread per tile: 64 bytes of 4-byte values, 64 of 8-byte ones (register budget).
template <typename T> constexpr int kItems = sizeof(T) >= 8 ? 8 : 16;
constexpr int kMinBlocksPerSm = 3;  // register cap of the passes over d: 80 per thread
template <typename T> constexpr int64_t kTile = int64_t{kThreads} * kItems<T>;

template <typename T> using KeyOf = typename MagnitudeTraits<T>::Key;

// Bits a key can use (all keys are below 2^kKeyBits) and the width of the first digit.
template <typename T> struct KeyLayout;
template <int KeyBits, int FirstDigit> struct KeyLayoutOf {
    static constexpr int kKeyBits = KeyBits, kFirstDigit = FirstDigit;
};
template <> struct KeyLayout<float> : KeyLayoutOf<31, 12> {};
template <> struct KeyLayout<double> : KeyLayoutOf<63, 13> {};
template <> struct KeyLayout<float16_bits> : KeyLayoutOf<15, 12> {};
template <> struct KeyLayout<bfloat16_bits> : KeyLayoutOf<15, 12> {};
template <typename T> constexpr int kMaxBins = 1 << KeyLayout<T>::kFirstDigit;

}  // namespace gtopk::cuda::detail
