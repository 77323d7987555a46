// Rows of fp32 activations quantized to uint8, one scale per row, for the int8 convs
// (fused_int8_cpu.cpp: ls_quantize_rows_u8_cpu and the quantization of a conv's output blocks):
// q = rint(x * (255 / max of the row)) (round to nearest even, as MXCSR's default and rintf),
// scale = max / 255. A row may be two segments side by side, a's ca values then b's cb (a
// concatenation never made). Host only, AVX-512; the including file compiles these under
// LS_VNNI_TARGET and calls them only where the CPU has AVX512_VNNI.
//
// Rows go 16 at a time: each row's maximum folds into one vector of 16 partial maxima, and one
// transposing reduction turns the 16 vectors into the 16 maxima, one per lane; the scales and
// their inverses are then one division each for all 16 rows. One row at a time (a horizontal
// reduction, a scalar division and a broadcast per row) took 6 % of a KITTI frame's int8 network
// time on the Intel Xeon (perf), most of it per-row overhead on rows of 32 to 96 channels.
#pragma once
#include <immintrin.h>
#include <stdint.h>

#ifndef LS_VNNI_TARGET
#error "quantize_u8.h: define LS_VNNI_TARGET (the AVX-512 target attribute) before including"
#endif

namespace lidarseg {
namespace quantize_u8 {

constexpr int kLanes = 16;     // fp32 values per vector
constexpr int kBatchRows = 16;  // rows quantized together: one lane of maxima each

inline __mmask16 lane_mask(int64_t left) {
  return left >= kLanes ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
}

// The largest bit pattern of a row segment, as unsigned 32-bit integers, folded into top. For
// non-negative finite floats the largest pattern is the largest value; a negative value (its
// sign bit set, -0.0 too), +inf and NaN all lie above FLT_MAX's pattern, so one unsigned max per
// vector both finds the row's largest value and tells whether the row can be quantized.
LS_VNNI_TARGET inline void segment_max(const float* row, int64_t c, __m512i& top) {
  for (int64_t j = 0; j < c; j += kLanes) {
    const __mmask16 m = lane_mask(c - j);
    top = _mm512_max_epu32(top, _mm512_maskz_loadu_epi32(m, row + j));
  }
}

// q[j] = rint(row[j] * inv) saturated to 0..255 (every value of a quantized row lands there).
LS_VNNI_TARGET inline void segment_store(const float* row, int64_t c, __m512 inv, uint8_t* q) {
  for (int64_t j = 0; j < c; j += kLanes) {
    const __mmask16 m = lane_mask(c - j);
    const __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, row + j), inv));
    const __m128i bytes = _mm512_cvtusepi32_epi8(v);
    if (m == 0xFFFF) {
      _mm_storeu_si128((__m128i*)(q + j), bytes);
    } else {
      _mm_mask_storeu_epi8(q + j, m, bytes);
    }
  }
}

// max(0, x) in place, as fused_epilogue's ReLU (NaN and -0.0 to +0.0: vmaxps returns its second
// operand, zero, for a NaN and for two zeros).
LS_VNNI_TARGET inline void relu_row(float* row, int64_t c) {
  for (int64_t j = 0; j < c; j += kLanes) {
    const __mmask16 m = lane_mask(c - j);
    _mm512_mask_storeu_ps(row + j, m, _mm512_max_ps(_mm512_maskz_loadu_ps(m, row + j),
                                                    _mm512_setzero_ps()));
  }
}

// Lane i of the result: the largest (unsigned) of m[i]'s 16 lanes. Each step halves the vectors
// and the lanes a row holds: 256-bit halves, then 128-bit units (row 4k + u in unit u of the
// k-th vector), then pairs and single lanes inside the units, which leaves row 4l + u at lane
// 4u + l; one permutation puts row i at lane i.
LS_VNNI_TARGET inline __m512i lane_maxima(const __m512i (&m)[kBatchRows]) {
  __m512i half[8], unit[4];
  for (int k = 0; k < 8; ++k) {
    half[k] = _mm512_max_epu32(_mm512_shuffle_i32x4(m[2 * k], m[2 * k + 1], 0x44),
                               _mm512_shuffle_i32x4(m[2 * k], m[2 * k + 1], 0xEE));
  }
  for (int k = 0; k < 4; ++k) {
    unit[k] = _mm512_max_epu32(_mm512_shuffle_i32x4(half[2 * k], half[2 * k + 1], 0x88),
                               _mm512_shuffle_i32x4(half[2 * k], half[2 * k + 1], 0xDD));
  }
  __m512i pair[2];
  for (int k = 0; k < 2; ++k) {
    pair[k] = _mm512_max_epu32(_mm512_unpacklo_epi64(unit[2 * k], unit[2 * k + 1]),
                               _mm512_unpackhi_epi64(unit[2 * k], unit[2 * k + 1]));
  }
  const __m512 p0 = _mm512_castsi512_ps(pair[0]), p1 = _mm512_castsi512_ps(pair[1]);
  const __m512i lanes =
      _mm512_max_epu32(_mm512_castps_si512(_mm512_shuffle_ps(p0, p1, _MM_SHUFFLE(2, 0, 2, 0))),
                       _mm512_castps_si512(_mm512_shuffle_ps(p0, p1, _MM_SHUFFLE(3, 1, 3, 1))));
  const __m512i order = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
  return _mm512_permutexvar_epi32(order, lanes);
}

// Rows [0, n) (n <= kBatchRows) of a [n, ca] and b [n, cb] (b may be null when cb is 0)
// quantized into q [n, ca + cb] and scale, after a ReLU in place on a's rows when relu (a is
// only read without); returns the rows that cannot be quantized (a negative value, -0.0
// included, NaN or inf) as a bit mask, leaving their q and scale unwritten.
LS_VNNI_TARGET inline uint32_t quantize_batch(float* a, int64_t ca, const float* b, int64_t cb,
                                             int64_t n, bool relu, uint8_t* q, float* scale) {
  constexpr uint32_t kLargestFinite = 0x7F7FFFFFu;  // FLT_MAX's bit pattern
  __m512i top[kBatchRows];
  for (int i = 0; i < kBatchRows; ++i) {
    top[i] = _mm512_setzero_si512();
    if (i >= n) continue;
    if (relu) relu_row(a + i * ca, ca);
    segment_max(a + i * ca, ca, top[i]);
    if (cb > 0) segment_max(b + i * cb, cb, top[i]);
  }
  const __m512i maxima = lane_maxima(top);
  const __mmask16 rows = lane_mask(n);
  const __mmask16 bad =
      _mm512_mask_cmpgt_epu32_mask(rows, maxima, _mm512_set1_epi32((int)kLargestFinite));
  const __mmask16 good = rows & ~bad;
  const __m512 most = _mm512_castsi512_ps(maxima), top_q = _mm512_set1_ps(255.0f);
  const __mmask16 positive = _mm512_cmp_ps_mask(most, _mm512_setzero_ps(), _CMP_GT_OQ);
  alignas(64) float inv[kLanes];
  _mm512_store_ps(inv, _mm512_maskz_div_ps(positive, top_q, most));  // 255 / max, 0 for 0
  _mm512_mask_storeu_ps(scale, good, _mm512_div_ps(most, top_q));
  const int64_t c = ca + cb;
  for (int i = 0; i < n; ++i) {
    if (!(good >> i & 1)) continue;
    const __m512 row_inv = _mm512_set1_ps(inv[i]);
    segment_store(a + i * ca, ca, row_inv, q + i * c);
    if (cb > 0) segment_store(b + i * cb, cb, row_inv, q + i * c + ca);
  }
  return bad;
}

// quantize_batch over rows [0, n), kBatchRows at a time; true when every row could be.
LS_VNNI_TARGET inline bool quantize_rows(float* a, int64_t ca, const float* b, int64_t cb,
                                         int64_t n, bool relu, uint8_t* q, float* scale) {
  uint32_t bad = 0;
  for (int64_t r = 0; r < n; r += kBatchRows) {
    const int64_t rows = n - r < kBatchRows ? n - r : kBatchRows;
    bad |= quantize_batch(a + r * ca, ca, cb > 0 ? b + r * cb : nullptr, cb, rows, relu,
                          q + r * (ca + cb), scale + r);
  }
  return bad == 0;
}

}  // namespace quantize_u8
}  // namespace lidarseg
