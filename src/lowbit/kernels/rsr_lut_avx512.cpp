// rsr-lut with AVX-512BW: the lookups are `vpermw` into int16 tables (tab16, rsr_lut.h), so the AVX2 kernel's split
// of each table into its low and high bytes, and the four `vpunpck` that put them back together (port 5, like every
// shuffle), are gone. A zmm of codes is read as 32 words; word i of a chunk's 32 bytes holds four rows' nibbles
// (bits 0-3 row 2i, 4-7 row 32 + 2i, 8-11 row 2i + 1, 12-15 row 33 + 2i), and `vpermw` looks up the five low bits of
// each word's shifts by 0, 4, 8 and 12. Per 64 bytes of codes: 3 shifts, 4 `vpermw`, 4 adds (and, binary only,
// 4 `vpternlogd`), against 2 + 4 + 4 + 4 `vpand`/`vpshufb`/`vpunpck`/add and 2 table shuffles before (10 of them
// on port 5).
//   - 2 or more planes (ternary, int2): a zmm holds two planes of one chunk (the layout stores a chunk's planes
//     one after the other), the table is the chunk's 16 entries twice, so bit 4 of an index (the next nibble's bit)
//     does not matter and no masking is needed; the halves accumulate their own plane, whose sign and shift apply
//     when the int16 sums widen.
//   - 1 plane (binary): a zmm holds chunks c and c + 1, the table their two 16 entries, and bit 4 of the index
//     (one `vpternlogd`: the nibble, then 16 in the upper half) selects the chunk.
// An int16 lane adds one raw table entry (|T| <= 508) per step and widens every kLutLaneSpan steps.
#include <immintrin.h>

#include <algorithm>

#include "common.h"
#include "dispatch.h"
#include "rsr_lut.h"

namespace lowbit {
namespace {

constexpr int64_t kLutLaneSpan = 32767 / 508;  // int16 adds of raw table entries before a lane must widen

// The code stream's prefetch goes into L2 or L1 by the core (stream_prefetch_l1, read once a process): into L1 (T0,
// as the dense GEMV) it cost more than it gave on a Zen 4 (one token from DRAM, 1 thread: binary 2^15 x 2^15 7.4-8.1
// ms with T0, 6.5-6.9 with none, 5.5 with T1; ternary 16384 x 16384 3.7-3.8 / 3.3-3.4 / 2.9-3.0 ms); on a Zen 5 it
// gave 1.05x over T1 (binary 2^15, 2 threads, scripts/rsr_lut_bench.py: 3.72-3.89 against 4.00-4.07 ms); the Xeon
// of stop 27 needed a prefetch (11.3 -> 4.64 ms).
const bool kCodesIntoL1 = stream_prefetch_l1();
inline void prefetch_codes(const char* p) { stream_prefetch<1>(p, kCodesIntoL1); }

// the four lookups of the words of v (32 int16 lanes), shifted by 0, 4, 8 and 12, into T; added to a[0..3]
template <bool FLAG>
[[gnu::always_inline]] inline void lookup4(__m512i v, __m512i T, __m512i flag, __m512i* a) {
  const __m512i x[4] = {v, _mm512_srli_epi16(v, 4), _mm512_srli_epi16(v, 8), _mm512_srli_epi16(v, 12)};
  for (int s = 0; s < 4; ++s) {
    // FLAG: (x & 15) | flag, imm (A & B) | C
    const __m512i idx = FLAG ? _mm512_ternarylogic_epi32(x[s], _mm512_set1_epi16(15), flag, 0xEA) : x[s];
    a[s] = _mm512_add_epi16(a[s], _mm512_permutexvar_epi16(idx, T));
  }
}

// lanes 0-15 (lo) or 16-31 of an int16 sum as int32, times the plane's sign and power of two
[[gnu::always_inline]] inline __m512i widen_half(__m512i a, bool upper, int sh, bool neg) {
  __m512i w = _mm512_cvtepi16_epi32(upper ? _mm512_extracti64x4_epi64(a, 1) : _mm512_castsi512_si256(a));
  w = _mm512_slli_epi32(w, (unsigned)sh);
  return neg ? _mm512_sub_epi32(_mm512_setzero_si512(), w) : w;
}

// lanes 0-15 and 16-31 of an int16 sum as int32, each times its plane's sign and power of two, added
[[gnu::always_inline]] inline __m512i widen(__m512i a, int sh0, bool neg0, int sh1, bool neg1) {
  return _mm512_add_epi32(widen_half(a, false, sh0, neg0), widen_half(a, true, sh1, neg1));
}

// acc[s] lane i (s = 0..3) is row 2i, 32 + 2i, 2i + 1, 33 + 2i
[[gnu::always_inline]] inline void store_rows(const __m512i* acc, int32_t* out) {
  const __m512i even_odd_lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i even_odd_hi = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
  _mm512_storeu_si512(out, _mm512_permutex2var_epi32(acc[0], even_odd_lo, acc[2]));
  _mm512_storeu_si512(out + 16, _mm512_permutex2var_epi32(acc[0], even_odd_hi, acc[2]));
  _mm512_storeu_si512(out + 32, _mm512_permutex2var_epi32(acc[1], even_odd_lo, acc[3]));
  _mm512_storeu_si512(out + 48, _mm512_permutex2var_epi32(acc[1], even_odd_hi, acc[3]));
}

void tile_binary(const uint8_t* wt, const int16_t* tab, int64_t K4, const LutPlanes& p, int32_t* out) {
  const uint8_t* last = wt + (K4 - 1) * 32;
  const __m512i flag = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(16), 1);
  __m512i acc[4];
  for (int s = 0; s < 4; ++s) acc[s] = _mm512_setzero_si512();
  for (int64_t c0 = 0; c0 < K4; c0 += 2 * kLutLaneSpan) {
    const int64_t c1 = std::min(K4, c0 + 2 * kLutLaneSpan);
    __m512i a[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
    int64_t c = c0;
    for (; c + 1 < c1; c += 2) {  // the tile's codes are one stream: kPrefetchBytes ahead, a line per 64 bytes
      prefetch_codes(prefetch_target(wt + c * 32, last));
      lookup4<true>(_mm512_loadu_si512(wt + c * 32), _mm512_loadu_si512(tab + c * 16), flag, a);
    }
    if (c < c1)  // a last lone chunk: the upper half's codes 0 look up entry 16, 0
      lookup4<true>(_mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i*)(wt + c * 32))),
                    _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i*)(tab + c * 16))), flag, a);
    for (int s = 0; s < 4; ++s)
      acc[s] = _mm512_add_epi32(acc[s], widen(a[s], p.shift[0], p.neg[0], p.shift[0], p.neg[0]));
  }
  store_rows(acc, out);
}

// Two tiles of a binary matrix at once: a zmm holds chunk c of both (tile 0's 32 bytes, then tile 1's), so the
// table is chunk c's 16 entries twice and, as for two planes, bit 4 of an index never matters: no vpternlogd
// (tile_binary masks each of its four indices to pick one of two chunks' tables). 12 vector ops per 64 bytes of
// codes against 15. The halves of each int16 sum are the two tiles' rows.
void tile2_binary(const uint8_t* wt0, const uint8_t* wt1, const int8_t* tab8, int64_t K4, const LutPlanes& p,
                  int32_t* out0, int32_t* out1) {
  const int16_t* tab = reinterpret_cast<const int16_t*>(tab8);
  const uint8_t *last0 = wt0 + (K4 - 1) * 32, *last1 = wt1 + (K4 - 1) * 32;
  const __m512i none = _mm512_setzero_si512();
  __m512i acc0[4], acc1[4];
  for (int s = 0; s < 4; ++s) acc0[s] = acc1[s] = _mm512_setzero_si512();
  for (int64_t c0 = 0; c0 < K4; c0 += kLutLaneSpan) {
    const int64_t c1 = std::min(K4, c0 + kLutLaneSpan);
    __m512i a[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
    for (int64_t c = c0; c < c1; ++c) {
      if ((c & 1) == 0) {  // two streams, a line of each per two chunks
        prefetch_codes(prefetch_target(wt0 + c * 32, last0));
        prefetch_codes(prefetch_target(wt1 + c * 32, last1));
      }
      const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i*)(wt0 + c * 32))),
                                           _mm256_loadu_si256((const __m256i*)(wt1 + c * 32)), 1);
      const __m512i T = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i*)(tab + c * 16)));
      lookup4<false>(v, T, none, a);
    }
    for (int s = 0; s < 4; ++s) {
      acc0[s] = _mm512_add_epi32(acc0[s], widen_half(a[s], false, p.shift[0], p.neg[0]));
      acc1[s] = _mm512_add_epi32(acc1[s], widen_half(a[s], true, p.shift[0], p.neg[0]));
    }
  }
  store_rows(acc0, out0);
  store_rows(acc1, out1);
}

template <int PLANES>
void tile_planes(const uint8_t* wt, const int16_t* tab, int64_t K4, const LutPlanes& p, int32_t* out) {
  constexpr int kPairs = (PLANES + 1) / 2;
  const uint8_t* last = wt + (K4 * PLANES - 1) * 32;
  const __m512i none = _mm512_setzero_si512();
  __m512i acc[4];
  for (int s = 0; s < 4; ++s) acc[s] = _mm512_setzero_si512();
  for (int64_t c0 = 0; c0 < K4; c0 += kLutLaneSpan) {
    const int64_t c1 = std::min(K4, c0 + kLutLaneSpan);
    __m512i a[kPairs][4];
    for (int j = 0; j < kPairs; ++j)
      for (int s = 0; s < 4; ++s) a[j][s] = _mm512_setzero_si512();
    for (int64_t c = c0; c < c1; ++c) {
      const uint8_t* w = wt + c * PLANES * 32;
      for (int b = 0; b < PLANES * 32; b += 64) prefetch_codes(prefetch_target(w + b, last));
      const __m512i T = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i*)(tab + c * 16)));
      for (int j = 0; j < kPairs; ++j) {
        const __m512i v = 2 * j + 1 < PLANES ? _mm512_loadu_si512(w + 64 * j)
                                             : _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i*)(w + 64 * j)));
        lookup4<false>(v, T, none, a[j]);
      }
    }
    for (int j = 0; j < kPairs; ++j) {
      const int q = 2 * j + 1 < PLANES ? 2 * j + 1 : 2 * j;  // a lone last plane's upper half summed T[0] = 0
      for (int s = 0; s < 4; ++s)
        acc[s] = _mm512_add_epi32(acc[s], widen(a[j][s], p.shift[2 * j], p.neg[2 * j], p.shift[q], p.neg[q]));
    }
  }
  store_rows(acc, out);
}

void tile(const uint8_t* wt, const int8_t* tab, int64_t K4, const LutPlanes& p, int32_t* out) {
  const int16_t* t16 = reinterpret_cast<const int16_t*>(tab);
  switch (p.planes) {
    case 1: return tile_binary(wt, t16, K4, p, out);
    case 2: return tile_planes<2>(wt, t16, K4, p, out);
    case 3: return tile_planes<3>(wt, t16, K4, p, out);
    default: return tile_planes<4>(wt, t16, K4, p, out);
  }
}

}  // namespace

const LutKernels lut_kernels_avx512{"avx512", tile, /*i16_tables=*/true, tile2_binary};

}  // namespace lowbit
