// Sparse merge with re-selection: union of two index-sorted sets, values summed, then top-k.
//
// Plan, for n = n_a + n_b input entries split into P pieces (one per thread; order and NaN rule:
// magnitude_order.h):
//   1. Merge path: the diagonal p * n / P of the merge grid is split by a binary search into
//      (i, j) = entries of a and of b before it; an index present in both sets is never split
//      between two pieces. Each piece is merged branch-free into the workspace (equal indices
//      summed), then every s-th of its output keys is sampled (s the largest power of two
//      with 2 s kSampleTarget <= n: up to 2 kSampleTarget samples, fewer where a and b share
//      indices).
//   2. If the union holds at most k entries it is the result: the pieces are copied out.
//   3. Otherwise a band [lo, hi] of keys that holds the k-th largest key K is guessed from the
//      sample: with q = k / |union| and m samples, the k-th key's rank among them is about q m,
//      with a standard deviation of sqrt(m q (1 - q)); lo and hi are the sample's keys
//      kBandSigmas deviations (+ 1) below and above it. One pass per piece counts the keys > hi
//      and gathers those in the band. If the count above is < k <= the count above + the band's,
//      K is in the band (the sample was off by less than the margin); otherwise, which the
//      margin makes rare, the top kDigitBits bits of every key are counted and the band is the
//      bin that holds K, gathered again. Radix refinement then nth_element over a copy of the
//      band's keys give K. Counting the gathered keys > K and == K per piece gives each piece's
//      number of outputs and its share of the ties (the first ones in index order).
//   4. Each piece writes its outputs at its prefix offset, branch-free.
// Passes over the union: one merge (writes it), one gather (reads its values), one write. With
// AVX-512 or AVX2, for float32 values and int32 indices, all three are vectorised: the merge is a
// bitonic network over packed (index, value) entries whose output is summed and compressed a
// chunk at a time while in L1, gather and write compress by mask (8 or 16 entries holding a tie
// with the k-th key are written one by one, in index order).
#include <omp.h>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "gtopk/cpu_ops.h"
#include "select_engine.h"

namespace gtopk::cpu {
namespace {

constexpr int kDigitBits = 11;
constexpr int64_t kBins = int64_t{1} << kDigitBits;
constexpr int64_t kRefineMax = 4096;  // below this many keys nth_element finishes directly
constexpr int64_t kSampleTarget = 4096;  // union keys sampled to guess the k-th key's band
constexpr double kBandSigmas = 4.0;      // the band's margin each side, in standard deviations

template <typename T> using KeyOf = typename MagnitudeTraits<T>::Key;

// Shift of the top digit: keys use at most 8 * sizeof(Key) - 1 bits (the sign bit is masked).
template <typename T> constexpr int top_shift() {
    return 8 * static_cast<int>(sizeof(KeyOf<T>)) - 1 - kDigitBits;
}

template <typename T> inline KeyOf<T> bits_of(T value) {
    KeyOf<T> bits;
    std::memcpy(&bits, &value, sizeof(bits));
    return bits;
}

template <typename T> inline T from_bits(KeyOf<T> bits) {
    T value;
    std::memcpy(&value, &bits, sizeof(value));
    return value;
}

template <typename T, typename Index> struct Workspace {
    std::vector<Index> union_index;
    std::vector<T> union_value;
    std::vector<KeyOf<T>> sample;      // each piece's sampled keys, at its offset / stride + p
    std::vector<uint32_t> histograms;  // pieces x kBins, only when the band missed
    std::vector<KeyOf<T>> gathered;    // the band's keys, each piece's at its offset
    std::vector<KeyOf<T>> scratch;     // a copy of them that the selection reorders
};

// One per calling thread and type pair: buffers grow to the largest merge seen, then are reused.
template <typename T, typename Index> Workspace<T, Index>& workspace() {
    static thread_local Workspace<T, Index> instance;
    return instance;
}

template <typename V> void grow(std::vector<V>& buffer, size_t n) {
    if (buffer.size() < n) buffer.resize(n);
}

// flag ? x : y without a branch.
template <typename V> inline V select(bool flag, V x, V y) {
    using U = std::make_unsigned_t<V>;
    const U mask = U{0} - static_cast<U>(flag);
    return static_cast<V>((static_cast<U>(x) & mask) | (static_cast<U>(y) & ~mask));
}

struct Piece {
    int64_t a_begin, a_end, b_begin, b_end;
    int64_t offset() const { return a_begin + b_begin; }  // where its merged entries start
};

// Entries of a among the first p of the merge (a's entry first on equal indices).
template <typename Index>
int64_t merge_path_split(const Index* index_a, int64_t n_a, const Index* index_b, int64_t n_b,
                         int64_t p) {
    int64_t lo = std::max<int64_t>(0, p - n_b), hi = std::min(p, n_a);
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (index_a[mid] <= index_b[p - mid - 1]) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo;
}

template <typename Index>
std::vector<Piece> split_pieces(const Index* index_a, int64_t n_a, const Index* index_b,
                                int64_t n_b, int pieces) {
    std::vector<int64_t> cut_a(pieces + 1), cut_b(pieces + 1);
    cut_a[0] = cut_b[0] = 0;
    cut_a[pieces] = n_a;
    cut_b[pieces] = n_b;
    const int64_t n = n_a + n_b;
    for (int p = 1; p < pieces; ++p) {
        const int64_t diagonal = n * p / pieces;
        int64_t i = merge_path_split(index_a, n_a, index_b, n_b, diagonal);
        int64_t j = diagonal - i;
        // a[i - 1] ends the previous piece: its twin in b must end there too.
        if (i > 0 && j < n_b && index_a[i - 1] == index_b[j]) ++j;
        cut_a[p] = i;
        cut_b[p] = j;
    }
    std::vector<Piece> result(pieces);
    for (int p = 0; p < pieces; ++p) result[p] = {cut_a[p], cut_a[p + 1], cut_b[p], cut_b[p + 1]};
    return result;
}

// The vectorised merge of float32 values with int32 indices (>= 0). An entry is packed into 64
// bits, index above value bits: packed order is index order, and an index present in both sets
// gives two neighbours. The sets are merged 8 packed entries at a time by a bitonic network
// (blocks padded with sentinels, which sort last), then one pass sums neighbours with equal
// indices (a + b == b + a; NaN sums canonical as in the scalar loop) and compresses.
// Each instruction set below defines Block (8 packed entries), load_block, store_block,
// merge_blocks, packed_less_equal, kSentinel, pack_entry, pack_block and combine_packed;
// PackedSet (a set read as packed blocks) and merge_combine are shared.
#if defined(__AVX512F__)
// AVX-512: a Block is one register; the sentinel is all ones, above every entry (index < 2^31).
constexpr uint64_t kSentinel = ~uint64_t{0};
using Block = __m512i;
inline Block load_block(const uint64_t* from) { return _mm512_loadu_si512(from); }
inline void store_block(uint64_t* to, Block block) { _mm512_storeu_si512(to, block); }
inline bool packed_less_equal(uint64_t x, uint64_t y) { return x <= y; }

// Sorts a bitonic sequence of 8 keys ascending.
inline __m512i sort_bitonic8(__m512i v) {
    __m512i t = _mm512_shuffle_i64x2(v, v, _MM_SHUFFLE(1, 0, 3, 2));  // t[i] = v[i ^ 4]
    v = _mm512_mask_blend_epi64(0xF0, _mm512_min_epu64(v, t), _mm512_max_epu64(v, t));
    t = _mm512_permutex_epi64(v, _MM_SHUFFLE(1, 0, 3, 2));  // t[i] = v[i ^ 2]
    v = _mm512_mask_blend_epi64(0xCC, _mm512_min_epu64(v, t), _mm512_max_epu64(v, t));
    t = _mm512_permutex_epi64(v, _MM_SHUFFLE(2, 3, 0, 1));  // t[i] = v[i ^ 1]
    return _mm512_mask_blend_epi64(0xAA, _mm512_min_epu64(v, t), _mm512_max_epu64(v, t));
}

// Two ascending blocks of 8 -> the 8 smallest (low) and the 8 largest (high), ascending.
inline void merge_blocks(__m512i a, __m512i b, __m512i& low, __m512i& high) {
    const __m512i reversed =
        _mm512_permutexvar_epi64(_mm512_set_epi64(0, 1, 2, 3, 4, 5, 6, 7), b);
    low = sort_bitonic8(_mm512_min_epu64(a, reversed));
    high = sort_bitonic8(_mm512_max_epu64(a, reversed));
}

inline uint64_t pack_entry(int32_t index, float value) {
    return uint64_t{static_cast<uint32_t>(index)} << 32 | bits_of(value);
}

// The 8 entries from (index, value), packed.
inline Block pack_block(const int32_t* index, const float* value) {
    const __m512i i64 =
        _mm512_cvtepu32_epi64(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(index)));
    const __m512i v64 =
        _mm512_cvtepu32_epi64(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(value)));
    return _mm512_or_si512(_mm512_slli_epi64(i64, 32), v64);
}

// The union of merged[0..n) (merged[n] readable: the entry after, or a sentinel): neighbours
// with equal indices summed. carry: the entry before merged[0] was summed with it (in), the last
// one with merged[n] (out). Writes exactly the union; returns its size.
inline int64_t combine_packed(const uint64_t* merged, int64_t n, int32_t* out_index,
                              float* out_value, int64_t /*capacity*/, unsigned& carry) {
    const __m512 quiet_nan = _mm512_set1_ps(std::numeric_limits<float>::quiet_NaN());
    int64_t w = 0;
    for (int64_t j = 0; j < n; j += 8) {
        const __m512i current = _mm512_loadu_si512(merged + j);
        const __m512i following = _mm512_loadu_si512(merged + j + 1);
        const unsigned paired = _mm512_cmpeq_epi64_mask(_mm512_srli_epi64(current, 32),
                                                        _mm512_srli_epi64(following, 32));
        const unsigned valid = n - j >= 8 ? 0xFFu : (1u << (n - j)) - 1;
        const __mmask8 keep = static_cast<__mmask8>(~((paired << 1) | carry) & valid);
        carry = (paired >> 7) & 1u;
        __m512 sum = _mm512_add_ps(_mm512_castsi512_ps(current), _mm512_castsi512_ps(following));
        sum = _mm512_mask_mov_ps(sum, _mm512_cmp_ps_mask(sum, sum, _CMP_UNORD_Q), quiet_nan);
        const __m512i values = _mm512_mask_blend_epi64(static_cast<__mmask8>(paired), current,
                                                       _mm512_castps_si512(sum));
        const __m256i index32 = _mm512_cvtepi64_epi32(_mm512_srli_epi64(current, 32));
        const __m256i value32 = _mm512_cvtepi64_epi32(values);
        const int count = __builtin_popcount(keep);
        const __mmask8 first = static_cast<__mmask8>((1u << count) - 1);
        _mm256_mask_storeu_epi32(out_index + w, first, _mm256_maskz_compress_epi32(keep, index32));
        _mm256_mask_storeu_epi32(out_value + w, first, _mm256_maskz_compress_epi32(keep, value32));
        w += count;
    }
    return w;
}
#elif defined(__AVX2__)
// AVX2 compares 64-bit lanes as signed only: entries are packed with the top bit flipped
// (index ^ 2^31 above the value bits), which turns unsigned order into signed order, and the
// all-ones sentinel becomes INT64_MAX, above every entry (their top bit is set). Its index half,
// 0x7FFFFFFF, is no flipped index either. A Block is two registers of 4 entries.
constexpr uint64_t kFlip = uint64_t{1} << 63;
constexpr uint64_t kSentinel = ~uint64_t{0} ^ kFlip;
struct Block {
    __m256i low, high;  // entries 0-3 and 4-7
};
inline Block load_block(const uint64_t* from) {
    return {_mm256_loadu_si256(reinterpret_cast<const __m256i*>(from)),
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(from + 4))};
}
inline void store_block(uint64_t* to, Block block) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(to), block.low);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(to + 4), block.high);
}
inline bool packed_less_equal(uint64_t x, uint64_t y) {
    return static_cast<int64_t>(x) <= static_cast<int64_t>(y);
}

// mask ? y : x per 64-bit lane, for masks of all-ones or all-zeros lanes.
inline __m256i select64(__m256i x, __m256i y, __m256i mask) {
    return _mm256_castpd_si256(_mm256_blendv_pd(_mm256_castsi256_pd(x), _mm256_castsi256_pd(y),
                                                 _mm256_castsi256_pd(mask)));
}

// One compare-exchange step between v and its partners t (a shuffle of v): the lanes in kUpper
// (a 32-bit lane blend mask) keep the larger of each pair, the others the smaller.
template <int kUpper> inline __m256i exchange(__m256i v, __m256i t) {
    const __m256i upper = _mm256_blend_epi32(_mm256_setzero_si256(), _mm256_set1_epi32(-1), kUpper);
    return select64(v, t, _mm256_xor_si256(_mm256_cmpgt_epi64(v, t), upper));
}

// Sorts a bitonic sequence of 8 entries ascending.
inline Block sort_bitonic8(Block v) {
    const __m256i greater = _mm256_cmpgt_epi64(v.low, v.high);  // distance 4
    __m256i halves[2] = {select64(v.low, v.high, greater), select64(v.high, v.low, greater)};
    for (__m256i& x : halves) {
        x = exchange<0xF0>(x, _mm256_permute2x128_si256(x, x, 0x01));             // i ^ 2
        x = exchange<0xCC>(x, _mm256_shuffle_epi32(x, _MM_SHUFFLE(1, 0, 3, 2)));  // i ^ 1
    }
    return {halves[0], halves[1]};
}

// Two ascending blocks of 8 -> the 8 smallest (low) and the 8 largest (high), ascending.
inline void merge_blocks(Block a, Block b, Block& low, Block& high) {
    const __m256i reversed_low = _mm256_permute4x64_epi64(b.high, _MM_SHUFFLE(0, 1, 2, 3));
    const __m256i reversed_high = _mm256_permute4x64_epi64(b.low, _MM_SHUFFLE(0, 1, 2, 3));
    const __m256i greater_low = _mm256_cmpgt_epi64(a.low, reversed_low);
    const __m256i greater_high = _mm256_cmpgt_epi64(a.high, reversed_high);
    low = sort_bitonic8({select64(a.low, reversed_low, greater_low),
                         select64(a.high, reversed_high, greater_high)});
    high = sort_bitonic8({select64(reversed_low, a.low, greater_low),
                          select64(reversed_high, a.high, greater_high)});
}

// kCompress[mask]: the lanes set in mask, ascending, one per byte (for permutevar8x32).
constexpr std::array<uint64_t, 256> kCompress = [] {
    std::array<uint64_t, 256> table{};
    for (int mask = 0; mask < 256; ++mask) {
        int slot = 0;
        for (int lane = 0; lane < 8; ++lane) {
            if (mask >> lane & 1) table[mask] |= uint64_t(lane) << (8 * slot++);
        }
    }
    return table;
}();

// Writes the 32-bit lanes of v set in mask, in lane order, to to[0..popcount(mask)); writes 8
// lanes (the rest garbage) when room >= 8, else exactly popcount(mask).
inline void store_compressed(void* to, __m256i v, unsigned mask, int64_t room) {
    const __m256i lanes = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(kCompress[mask]));
    const __m256i packed = _mm256_permutevar8x32_epi32(v, lanes);
    if (room >= 8) {
        _mm256_storeu_si256(static_cast<__m256i*>(to), packed);
        return;
    }
    alignas(32) uint32_t buffer[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(buffer), packed);
    std::memcpy(to, buffer, sizeof(uint32_t) * __builtin_popcount(mask));
}

inline uint64_t pack_entry(int32_t index, float value) {
    return (uint64_t{static_cast<uint32_t>(index)} << 32 | bits_of(value)) ^ kFlip;
}

// The 8 entries from (index, value), packed.
inline Block pack_block(const int32_t* index, const float* value) {
    const __m256i i32 = _mm256_xor_si256(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(index)),
        _mm256_set1_epi32(std::numeric_limits<int32_t>::min()));
    const __m256i v32 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(value));
    const __m256i first = _mm256_unpacklo_epi32(v32, i32);   // entries 0, 1 | 4, 5
    const __m256i second = _mm256_unpackhi_epi32(v32, i32);  // entries 2, 3 | 6, 7
    return {_mm256_permute2x128_si256(first, second, 0x20),
            _mm256_permute2x128_si256(first, second, 0x31)};
}

// The union of merged[0..n) (merged[n] readable: the entry after, or a sentinel): neighbours
// with equal indices summed. carry: the entry before merged[0] was summed with it (in), the last
// one with merged[n] (out). May write garbage after the union up to capacity entries of out;
// returns the union's size.
inline int64_t combine_packed(const uint64_t* merged, int64_t n, int32_t* out_index,
                              float* out_value, int64_t capacity, unsigned& carry) {
    const __m256 quiet_nan = _mm256_set1_ps(std::numeric_limits<float>::quiet_NaN());
    const __m256i value_half = _mm256_set1_epi64x(0xFFFFFFFF);
    const __m256i unzip = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);  // 4 values, 4 indices
    const __m256i flip = _mm256_set1_epi32(std::numeric_limits<int32_t>::min());
    int64_t w = 0;
    for (int64_t j = 0; j < n; j += 8) {
        unsigned paired = 0;
        __m256i unzipped[2];
        for (int half = 0; half < 2; ++half) {
            const uint64_t* at = merged + j + 4 * half;
            const __m256i current = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at));
            const __m256i following = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at + 1));
            // Equal indices: the high halves' compare, copied to the low halves.
            const __m256i same = _mm256_shuffle_epi32(_mm256_cmpeq_epi32(current, following),
                                                      _MM_SHUFFLE(3, 3, 1, 1));
            paired |= static_cast<unsigned>(_mm256_movemask_pd(_mm256_castsi256_pd(same)))
                      << (4 * half);
            __m256 sum = _mm256_add_ps(_mm256_castsi256_ps(current),
                                       _mm256_castsi256_ps(following));
            sum = _mm256_blendv_ps(sum, quiet_nan, _mm256_cmp_ps(sum, sum, _CMP_UNORD_Q));
            const __m256i entries = _mm256_blendv_epi8(current, _mm256_castps_si256(sum),
                                                       _mm256_and_si256(same, value_half));
            unzipped[half] = _mm256_permutevar8x32_epi32(entries, unzip);
        }
        const __m256i values = _mm256_permute2x128_si256(unzipped[0], unzipped[1], 0x20);
        const __m256i indices = _mm256_xor_si256(
            _mm256_permute2x128_si256(unzipped[0], unzipped[1], 0x31), flip);
        const unsigned valid = n - j >= 8 ? 0xFFu : (1u << (n - j)) - 1;
        const unsigned keep = ~((paired << 1) | carry) & valid;
        carry = (paired >> 7) & 1u;
        store_compressed(out_index + w, indices, keep, capacity - w);
        store_compressed(out_value + w, values, keep, capacity - w);
        w += __builtin_popcount(keep);
    }
    return w;
}
#endif

#if defined(__AVX512F__) || defined(__AVX2__)
// A set packed as it is read (no packing pass, no copy): whole blocks straight from its arrays,
// the last partial one from a copy padded with sentinels, then sentinels.
struct PackedSet {
    const int32_t* index;
    const float* value;
    int64_t n, whole;  // whole: entries in whole blocks
    uint64_t tail[16];
    PackedSet(const int32_t* index_, const float* value_, int64_t size)
        : index(index_), value(value_), n(size), whole(size / 8 * 8) {
        for (int e = 0; e < 16; ++e) {
            tail[e] = whole + e < n ? pack_entry(index[whole + e], value[whole + e]) : kSentinel;
        }
    }
    // A set is never read past its first sentinel block: i <= whole + 8.
    uint64_t first(int64_t i) const {
        return i < whole ? pack_entry(index[i], value[i]) : tail[i - whole];
    }
    Block block(int64_t i) const {
        return i < whole ? pack_block(index + i, value + i) : load_block(tail + (i - whole));
    }
};

// Merged entries are combined a chunk at a time while the chunk is in L1: the merge's output
// never goes to memory.
constexpr int64_t kChunk = 1024;

// The union of a and b (n >= 1 entries each) into (out_index, out_value), which hold capacity
// entries. Returns the union's size.
inline int64_t merge_combine(const PackedSet& a, const PackedSet& b, int32_t* out_index,
                             float* out_value, int64_t capacity) {
    alignas(64) uint64_t chunk[kChunk + 16];
    int64_t m = 0, combined = 0, w = 0;  // entries in chunk; merged entries combined; written
    unsigned carry = 0;
    // Appends a block; a full chunk (and the block after it, for the last entry's neighbour) is
    // combined and the block after it moved to the front.
    auto append = [&](Block block) {
        store_block(chunk + m, block);
        m += 8;
        if (m == kChunk + 8) {
            w += combine_packed(chunk, kChunk, out_index + w, out_value + w, capacity - w, carry);
            combined += kChunk;
            store_block(chunk, load_block(chunk + kChunk));
            m = 8;
        }
    };
    Block low, high;
    merge_blocks(a.block(0), b.block(0), low, high);
    append(low);
    int64_t i_a = 8, i_b = 8;
    while (i_a < a.n || i_b < b.n) {
        // The block whose first key is smaller comes next (an exhausted set: a sentinel).
        const bool take_a = packed_less_equal(a.first(i_a), b.first(i_b));
        const PackedSet& next = take_a ? a : b;
        const int64_t at = take_a ? i_a : i_b;
        i_a += take_a ? 8 : 0;
        i_b += take_a ? 0 : 8;
        merge_blocks(high, next.block(at), low, high);  // reverses next: off high's chain
        append(low);
    }
    store_block(chunk + m, high);  // m <= kChunk here
    for (int64_t j = m + 8; j < m + 16; ++j) chunk[j] = kSentinel;
    return w + combine_packed(chunk, a.n + b.n - combined, out_index + w, out_value + w,
                              capacity - w, carry);
}
#endif

// Merges one piece into (out_index, out_value). Returns the number of entries written.
// vectorised: float32 / int32 sets with non-negative indices, merged by the vectorised path
// where the build has one.
template <typename T, typename Index>
int64_t merge_piece(const Index* index_a, const T* value_a, int64_t n_a, const Index* index_b,
                    const T* value_b, int64_t n_b, Index* out_index, T* out_value,
                    [[maybe_unused]] bool vectorised) {
    using Key = KeyOf<T>;
#if defined(__AVX512F__) || defined(__AVX2__)
    if constexpr (std::is_same_v<T, float> && std::is_same_v<Index, int32_t>) {
        if (vectorised && n_a > 0 && n_b > 0) {
            const PackedSet a(index_a, value_a, n_a);
            const PackedSet b(index_b, value_b, n_b);
            return merge_combine(a, b, out_index, out_value, n_a + n_b);
        }
    }
#endif
    const Key quiet_nan = bits_of(std::numeric_limits<T>::quiet_NaN());
    int64_t a = 0, b = 0, n = 0;
    // Masks, not branches: which run comes next is a coin toss for random index sets, and a
    // mispredicted branch costs more than the rest of the iteration. (GCC turns ?: on these
    // into branches, so the selects are spelled out.)
    while (a < n_a && b < n_b) {
        const Index ia = index_a[a], ib = index_b[b];
        const T va = value_a[a], vb = value_b[b];
        const T sum = va + vb;
        const bool take_a = ia <= ib, take_b = ib <= ia;
        // The sum's NaN is made canonical so that it does not depend on operand order (x86
        // keeps the first operand's payload): merge(a, b) == merge(b, a) bit for bit.
        const Key sum_bits = select(sum != sum, quiet_nan, bits_of(sum));
        const Key bits = select(take_a & take_b, sum_bits,
                                select(take_a, bits_of(va), bits_of(vb)));
        out_index[n] = select(take_a, ia, ib);
        out_value[n] = from_bits<T>(bits);
        a += take_a;
        b += take_b;
        ++n;
    }
    auto copy_rest = [&](const Index* index, const T* value, int64_t from, int64_t to) {
        for (int64_t j = from; j < to; ++j, ++n) {
            out_index[n] = index[j];
            out_value[n] = value[j];
        }
    };
    copy_rest(index_a, value_a, a, n_a);
    copy_rest(index_b, value_b, b, n_b);
    return n;
}

// The r-th largest (1-based) of keys[0..m), all of which agree above bit `shift`. Reorders keys.
template <typename Key> Key kth_largest(Key* keys, int64_t m, int64_t r, int shift) {
    std::array<int64_t, kBins> histogram;
    while (m > kRefineMax && shift > 0) {
        const int next = std::max(0, shift - kDigitBits);
        const Key mask = static_cast<Key>((Key{1} << (shift - next)) - 1);
        histogram.fill(0);
        for (int64_t j = 0; j < m; ++j) ++histogram[(keys[j] >> next) & mask];
        int64_t bin = static_cast<int64_t>(mask);
        for (; histogram[bin] < r; --bin) r -= histogram[bin];
        int64_t kept = 0;
        for (int64_t j = 0; j < m; ++j) {
            keys[kept] = keys[j];
            kept += static_cast<int64_t>((keys[j] >> next) & mask) == bin;
        }
        m = kept;
        shift = next;
    }
    std::nth_element(keys, keys + (r - 1), keys + m, std::greater<>());
    return keys[r - 1];
}

// Copies the merged pieces, which may have gaps between them, to out in piece order.
template <typename T, typename Index>
void copy_out(const Index* from_index, const T* from_value, const std::vector<Piece>& pieces,
              const std::vector<int64_t>& counts, Index* out_index, T* out_value) {
    int64_t written = 0;
    for (size_t p = 0; p < pieces.size(); ++p) {
        std::memmove(out_index + written, from_index + pieces[p].offset(),
                     counts[p] * sizeof(Index));
        std::memmove(out_value + written, from_value + pieces[p].offset(), counts[p] * sizeof(T));
        written += counts[p];
    }
}

// Keys in [lo, hi].
template <typename Key> struct KeyBand {
    Key lo, hi;
    // Bits from which the band's keys agree: keys >> shift is the same for every one.
    int shift() const {
        const uint64_t differ = static_cast<uint64_t>(lo ^ hi);
        return differ == 0 ? 0 : 64 - __builtin_clzll(differ);
    }
};

// A band that holds the k-th largest of n keys, guessed from m of them (sample, reordered), the
// sample's rank of it +- kBandSigmas standard deviations + 1 (header, step 3).
template <typename Key>
KeyBand<Key> band_from_sample(Key* sample, int64_t m, int64_t k, int64_t n, Key max_key) {
    const double q = static_cast<double>(k) / static_cast<double>(n);
    const double rank = q * static_cast<double>(m);
    const double margin = kBandSigmas * std::sqrt(static_cast<double>(m) * q * (1.0 - q)) + 1.0;
    const int64_t above = static_cast<int64_t>(std::floor(rank - margin));  // 1-based
    const int64_t below = static_cast<int64_t>(std::ceil(rank + margin));
    KeyBand<Key> band{0, max_key};
    if (above >= 1) {
        std::nth_element(sample, sample + (above - 1), sample + m, std::greater<>());
        band.hi = sample[above - 1];
    }
    if (below <= m) {
        const int64_t sorted = std::max<int64_t>(above, 0);  // sample[sorted..) <= band.hi
        std::nth_element(sample + sorted, sample + (below - 1), sample + m, std::greater<>());
        band.lo = sample[below - 1];
    }
    return band;
}

// Writes to to[0..) the keys of values[0..n) in band, in order, and counts those above it into
// above; returns how many were written. Writes nothing past to[n - 1].
template <typename T>
int64_t gather_band(const T* values, int64_t n, KeyBand<KeyOf<T>> band, KeyOf<T>* to,
                    int64_t& above) {
    int64_t g = 0, j = 0, over = 0;
#if defined(__AVX512F__)
    if constexpr (std::is_same_v<T, float>) {
        const __m512i magnitude = _mm512_set1_epi32(0x7FFFFFFF);
        const __m512i canonical_nan = _mm512_set1_epi32(MagnitudeTraits<float>::kCanonicalNan);
        const __m512i lo = _mm512_set1_epi32(static_cast<int>(band.lo));
        const __m512i hi = _mm512_set1_epi32(static_cast<int>(band.hi));
        for (; j + 16 <= n; j += 16) {
            const __m512i keys = _mm512_min_epu32(
                _mm512_and_si512(_mm512_loadu_si512(values + j), magnitude), canonical_nan);
            const __mmask16 high = _mm512_cmpgt_epu32_mask(keys, hi);
            const __mmask16 hits = _mm512_cmpge_epu32_mask(keys, lo) & ~high;
            const int count = __builtin_popcount(hits);
            _mm512_mask_storeu_epi32(to + g, static_cast<__mmask16>((1u << count) - 1),
                                     _mm512_maskz_compress_epi32(hits, keys));
            g += count;
            over += __builtin_popcount(high);
        }
    }
#elif defined(__AVX2__)
    if constexpr (std::is_same_v<T, float>) {
        // Keys and the band's ends are below 2^31: signed compares order them.
        const __m256i magnitude = _mm256_set1_epi32(0x7FFFFFFF);
        const __m256i canonical_nan = _mm256_set1_epi32(MagnitudeTraits<float>::kCanonicalNan);
        const __m256i lo = _mm256_set1_epi32(static_cast<int>(band.lo));
        const __m256i hi = _mm256_set1_epi32(static_cast<int>(band.hi));
        for (; j + 8 <= n; j += 8) {
            const __m256i keys = _mm256_min_epu32(
                _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(values + j)),
                                 magnitude),
                canonical_nan);
            const unsigned high = _mm256_movemask_ps(
                _mm256_castsi256_ps(_mm256_cmpgt_epi32(keys, hi)));
            const unsigned low = _mm256_movemask_ps(
                _mm256_castsi256_ps(_mm256_cmpgt_epi32(lo, keys)));
            const unsigned hits = ~(high | low) & 0xFFu;
            store_compressed(to + g, keys, hits, 8);
            g += __builtin_popcount(hits);
            over += __builtin_popcount(high);
        }
    }
#endif
    for (; j < n; ++j) {
        const KeyOf<T> key = magnitude_key(values[j]);
        to[g] = key;
        g += key >= band.lo && key <= band.hi;
        over += key > band.hi;
    }
    above = over;
    return g;
}

// Counts the top digit of every key of values[0..n) into histogram.
template <typename T> void count_top_digits(const T* values, int64_t n, uint32_t* histogram) {
    for (int64_t j = 0; j < n; ++j) ++histogram[magnitude_key(values[j]) >> top_shift<T>()];
}

// Writes the entries of one piece that the top k keeps: key > kth_key, and the first `budget`
// entries with key == kth_key; exactly `quota` of them.
template <typename T, typename Index>
void write_kept(const Index* from_index, const T* from_value, int64_t n, KeyOf<T> kth_key,
                int64_t budget, int64_t quota, Index* to_index, T* to_value) {
    using Key = KeyOf<T>;
    int64_t w = 0, j = 0;
    auto scalar = [&](int64_t end) {  // branch-free; writes stay below quota
        for (; j < end && w < quota; ++j) {
            const Key key = magnitude_key(from_value[j]);
            const bool tie = key == kth_key;
            const bool keep = (key > kth_key) | (tie & (budget > 0));
            to_index[w] = from_index[j];
            to_value[w] = from_value[j];
            w += keep;
            budget -= tie & keep;
        }
    };
#if defined(__AVX512F__)
    if constexpr (std::is_same_v<T, float> && std::is_same_v<Index, int32_t>) {
        const __m512i magnitude = _mm512_set1_epi32(0x7FFFFFFF);
        const __m512i canonical_nan = _mm512_set1_epi32(MagnitudeTraits<float>::kCanonicalNan);
        const __m512i kth = _mm512_set1_epi32(static_cast<int>(kth_key));
        while (j + 16 <= n && w < quota) {
            const __m512 values = _mm512_loadu_ps(from_value + j);
            const __m512i keys = _mm512_min_epu32(
                _mm512_and_si512(_mm512_castps_si512(values), magnitude), canonical_nan);
            if (_mm512_cmpeq_epi32_mask(keys, kth)) {  // ties in these 16: in index order
                scalar(j + 16);
                continue;
            }
            const __mmask16 keep = _mm512_cmpgt_epu32_mask(keys, kth);
            const int count = __builtin_popcount(keep);
            const __mmask16 first = static_cast<__mmask16>((1u << count) - 1);
            _mm512_mask_storeu_epi32(to_index + w, first, _mm512_maskz_compress_epi32(
                keep, _mm512_loadu_si512(from_index + j)));
            _mm512_mask_storeu_ps(to_value + w, first, _mm512_maskz_compress_ps(keep, values));
            w += count;
            j += 16;
        }
    }
#elif defined(__AVX2__)
    if constexpr (std::is_same_v<T, float> && std::is_same_v<Index, int32_t>) {
        const __m256i magnitude = _mm256_set1_epi32(0x7FFFFFFF);
        const __m256i canonical_nan = _mm256_set1_epi32(MagnitudeTraits<float>::kCanonicalNan);
        const __m256i kth = _mm256_set1_epi32(static_cast<int>(kth_key));
        while (j + 8 <= n && w < quota) {
            const __m256i values =
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(from_value + j));
            const __m256i keys = _mm256_min_epu32(_mm256_and_si256(values, magnitude),
                                                  canonical_nan);
            if (!_mm256_testz_si256(_mm256_cmpeq_epi32(keys, kth), _mm256_cmpeq_epi32(keys, kth))) {
                scalar(j + 8);  // ties in these 8: in index order
                continue;
            }
            // Keys are below 2^31: the signed compare orders them.
            const unsigned keep =
                _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(keys, kth)));
            store_compressed(to_index + w,
                             _mm256_loadu_si256(reinterpret_cast<const __m256i*>(from_index + j)),
                             keep, quota - w);
            store_compressed(to_value + w, values, keep, quota - w);
            w += __builtin_popcount(keep);
            j += 8;
        }
    }
#endif
    scalar(n);
}

}  // namespace

template <typename T, typename Index>
int64_t merge_topk(const Index* index_a, const T* value_a, int64_t n_a, const Index* index_b,
                   const T* value_b, int64_t n_b, int64_t k, Index* out_index, T* out_value) {
    using Key = KeyOf<T>;
    constexpr int shift = top_shift<T>();
    const int64_t n_in = n_a + n_b;
    if (k <= 0 || n_in == 0) return 0;
    const int n_pieces = detail::threads_for(n_in);
    const std::vector<Piece> pieces = split_pieces(index_a, n_a, index_b, n_b, n_pieces);
    std::vector<int64_t> counts(n_pieces);
    Workspace<T, Index>& ws = workspace<T, Index>();
#if defined(__AVX512F__) || defined(__AVX2__)
    constexpr bool kVectorTypes = std::is_same_v<T, float> && std::is_same_v<Index, int32_t>;
#else
    constexpr bool kVectorTypes = false;
#endif
    // The vectorised merge packs indices as unsigned: only for non-negative ones.
    const bool vectorised = kVectorTypes && (n_a == 0 || index_a[0] >= 0) &&
                            (n_b == 0 || index_b[0] >= 0);
    auto merge_all = [&](Index* to_index, T* to_value, Key* sample, int64_t stride,
                         int64_t* sampled) {
#pragma omp parallel for num_threads(n_pieces) schedule(static, 1)
        for (int p = 0; p < n_pieces; ++p) {
            const Piece& piece = pieces[p];
            counts[p] = merge_piece(index_a + piece.a_begin, value_a + piece.a_begin,
                                    piece.a_end - piece.a_begin, index_b + piece.b_begin,
                                    value_b + piece.b_begin, piece.b_end - piece.b_begin,
                                    to_index + piece.offset(), to_value + piece.offset(),
                                    vectorised);
            if (sample == nullptr) continue;
            Key* mine = sample + piece.offset() / stride + p;
            const T* merged = to_value + piece.offset();
            int64_t m = 0;
            for (int64_t j = 0; j < counts[p]; j += stride) mine[m++] = magnitude_key(merged[j]);
            sampled[p] = m;
        }
    };

    // Step 2 first when every entry fits: out holds min(k, n_in) = n_in entries.
    if (n_in <= k) {
        merge_all(out_index, out_value, nullptr, 1, nullptr);
        copy_out(out_index, out_value, pieces, counts, out_index, out_value);
        int64_t n_union = 0;
        for (int64_t c : counts) n_union += c;
        return n_union;
    }

    int64_t stride = 1;
    while (2 * stride * kSampleTarget <= n_in) stride *= 2;
    grow(ws.union_index, n_in);
    grow(ws.union_value, n_in);
    grow(ws.sample, n_in / stride + n_pieces);
    std::vector<int64_t> sampled(n_pieces);
    const Index* union_index = ws.union_index.data();
    const T* union_value = ws.union_value.data();
    merge_all(ws.union_index.data(), ws.union_value.data(), ws.sample.data(), stride,
              sampled.data());
    int64_t n_union = 0;
    for (int64_t c : counts) n_union += c;
    if (n_union <= k) {
        copy_out(union_index, union_value, pieces, counts, out_index, out_value);
        return n_union;
    }

    // Step 3: a band that holds the k-th key, then the key itself.
    int64_t m = 0;  // the pieces' samples, packed
    for (int p = 0; p < n_pieces; ++p) {
        std::memmove(ws.sample.data() + m, ws.sample.data() + pieces[p].offset() / stride + p,
                     sampled[p] * sizeof(Key));
        m += sampled[p];
    }
    KeyBand<Key> band =
        band_from_sample(ws.sample.data(), m, k, n_union, MagnitudeTraits<T>::kCanonicalNan);
    grow(ws.gathered, n_in);
    Key* gathered = ws.gathered.data();  // piece p's band at pieces[p].offset()
    std::vector<int64_t> in_band(n_pieces), above_band(n_pieces);
    int64_t total_in = 0, total_above = 0;
    auto gather = [&] {
#pragma omp parallel for num_threads(n_pieces) schedule(static, 1)
        for (int p = 0; p < n_pieces; ++p) {
            in_band[p] = gather_band(union_value + pieces[p].offset(), counts[p], band,
                                     gathered + pieces[p].offset(), above_band[p]);
        }
        total_in = total_above = 0;
        for (int p = 0; p < n_pieces; ++p) {
            total_in += in_band[p];
            total_above += above_band[p];
        }
    };
    gather();
    if (!(total_above < k && k <= total_above + total_in)) {  // the band missed: K's top digit
        grow(ws.histograms, n_pieces * kBins);
        std::fill(ws.histograms.begin(), ws.histograms.begin() + n_pieces * kBins, 0u);
#pragma omp parallel for num_threads(n_pieces) schedule(static, 1)
        for (int p = 0; p < n_pieces; ++p) {
            count_top_digits(union_value + pieces[p].offset(), counts[p],
                             ws.histograms.data() + p * kBins);
        }
        int64_t bin = kBins - 1, rank = k;
        for (;; --bin) {
            int64_t count = 0;
            for (int p = 0; p < n_pieces; ++p) count += ws.histograms[p * kBins + bin];
            if (rank <= count) break;
            rank -= count;
        }
        const Key lowest = static_cast<Key>(bin) << shift;
        band = {lowest, static_cast<Key>(lowest | ((Key{1} << shift) - 1))};
        gather();
    }
    const int64_t rank = k - total_above;  // of K among the band's keys
    grow(ws.scratch, total_in);
    Key* band_keys = ws.scratch.data();
    for (int p = 0; p < n_pieces; ++p) {
        band_keys = std::copy(gathered + pieces[p].offset(),
                              gathered + pieces[p].offset() + in_band[p], band_keys);
    }
    const Key kth_key = kth_largest(ws.scratch.data(), total_in, rank, band.shift());

    // Each piece's outputs: entries above the k-th key, then its share of the ties.
    std::vector<int64_t> greater(n_pieces), ties(n_pieces);
    int64_t greater_in_band = 0;
    for (int p = 0; p < n_pieces; ++p) {
        const Key* mine = gathered + pieces[p].offset();
        int64_t g = 0, t = 0;
        for (int64_t j = 0; j < in_band[p]; ++j) {
            g += mine[j] > kth_key;
            t += mine[j] == kth_key;
        }
        greater[p] = above_band[p] + g;
        ties[p] = t;
        greater_in_band += g;
    }
    int64_t ties_left = rank - greater_in_band;  // ties the top k takes, lowest indices first
    std::vector<int64_t> tie_budget(n_pieces), out_offset(n_pieces + 1, 0);
    for (int p = 0; p < n_pieces; ++p) {
        tie_budget[p] = std::min(ties[p], ties_left);
        ties_left -= tie_budget[p];
        out_offset[p + 1] = out_offset[p] + greater[p] + tie_budget[p];
    }

    // Step 4: each piece writes its outputs at its offset.
#pragma omp parallel for num_threads(n_pieces) schedule(static, 1)
    for (int p = 0; p < n_pieces; ++p) {
        write_kept(union_index + pieces[p].offset(), union_value + pieces[p].offset(), counts[p],
                   kth_key, tie_budget[p], out_offset[p + 1] - out_offset[p],
                   out_index + out_offset[p], out_value + out_offset[p]);
    }
    return k;
}

#define GTOPK_INSTANTIATE(T, Index)                                                            \
    template int64_t merge_topk<T, Index>(const Index*, const T*, int64_t, const Index*,       \
                                          const T*, int64_t, int64_t, Index*, T*);
GTOPK_INSTANTIATE(float, int32_t)
GTOPK_INSTANTIATE(float, int64_t)
GTOPK_INSTANTIATE(double, int32_t)
GTOPK_INSTANTIATE(double, int64_t)
#undef GTOPK_INSTANTIATE

}  // namespace gtopk::cpu
