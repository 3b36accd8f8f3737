// The one total order every selection in gtopk_hvd uses, CPU and CUDA alike.
//
// An entry is (index i, value v). Its key is the magnitude of v read as an unsigned integer:
//     key(v) = min(bits(v) & ~sign_bit, canonical_nan)
// where canonical_nan = bits(+inf) + 1. For IEEE floats of one width the integer order of the
// sign-masked bits equals the order of |v|, so:
//     0 == -0  <  subnormals  <  normals  <  +-inf  <  every NaN (all NaNs equal)
// Entry a comes before entry b iff key(a) > key(b), or key(a) == key(b) and i(a) < i(b).
// "Top-k" is the first k entries in that order; results are always returned sorted by index.
//
// NaN rule: a NaN counts as larger than any number, so a NaN gradient is always selected and
// reaches the caller (who decides to skip or raise), instead of being silently dropped.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define GTOPK_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define GTOPK_HOST_DEVICE inline
#endif

namespace gtopk {

// Storage types for 16-bit floats: the kernels only look at their bits.
struct float16_bits { uint16_t bits; };
struct bfloat16_bits { uint16_t bits; };

template <typename T> struct MagnitudeTraits;

template <> struct MagnitudeTraits<float> {
    using Key = uint32_t;
    static constexpr Key kMagnitudeMask = 0x7FFFFFFFu;
    static constexpr Key kCanonicalNan = 0x7F800001u;  // bits(+inf) + 1
};
template <> struct MagnitudeTraits<double> {
    using Key = uint64_t;
    static constexpr Key kMagnitudeMask = 0x7FFFFFFFFFFFFFFFull;
    static constexpr Key kCanonicalNan = 0x7FF0000000000001ull;
};
template <> struct MagnitudeTraits<float16_bits> {
    using Key = uint16_t;
    static constexpr Key kMagnitudeMask = 0x7FFFu;
    static constexpr Key kCanonicalNan = 0x7C01u;
};
template <> struct MagnitudeTraits<bfloat16_bits> {
    using Key = uint16_t;
    static constexpr Key kMagnitudeMask = 0x7FFFu;
    static constexpr Key kCanonicalNan = 0x7F81u;
};

template <typename T> using MagnitudeKey = typename MagnitudeTraits<T>::Key;

template <typename T>
GTOPK_HOST_DEVICE typename MagnitudeTraits<T>::Key magnitude_key(T value) {
    using Traits = MagnitudeTraits<T>;
    typename Traits::Key bits;
    static_assert(sizeof(bits) == sizeof(value), "key and value widths differ");
    std::memcpy(&bits, &value, sizeof(bits));
    bits &= Traits::kMagnitudeMask;
    return bits < Traits::kCanonicalNan ? bits : Traits::kCanonicalNan;
}

// True iff entry (key_a, index_a) comes before (key_b, index_b) in the selection order.
template <typename Key, typename Index>
GTOPK_HOST_DEVICE bool precedes(Key key_a, Index index_a, Key key_b, Index index_b) {
    return key_a > key_b || (key_a == key_b && index_a < index_b);
}

}  // namespace gtopk
