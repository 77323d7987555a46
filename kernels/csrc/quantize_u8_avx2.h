// The row quantizer of quantize_u8.h in AVX2, for the 256-bit int8 kernels
// (fused_int8_avx2_cpu.cpp): the same bits, row by row. q = rint(x * (255 / max of the row))
// (vcvtps2dq and vcvtss2si round to nearest even, as MXCSR's default), scale = max / 255, each
// an IEEE multiply or division in fp32, as the AVX-512 code does them. The including file defines
// LS_INT8_AVX2_TARGET and calls these only where the CPU has AVX2.
#pragma once
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#ifndef LS_INT8_AVX2_TARGET
#error "quantize_u8_avx2.h: define LS_INT8_AVX2_TARGET (the AVX2 target attribute) first"
#endif

namespace lidarseg {
namespace quantize_u8_avx2 {

constexpr int kLanes = 8;  // fp32 values per vector

// The largest bit pattern of a row segment (unsigned), folded into top: for non-negative finite
// floats the largest value; a negative (-0.0 too), +inf or NaN lies above FLT_MAX's pattern.
LS_INT8_AVX2_TARGET inline uint32_t segment_top(const float* row, int64_t c, uint32_t top) {
  __m256i most = _mm256_setzero_si256();
  int64_t j = 0;
  for (; j + kLanes <= c; j += kLanes) {
    most = _mm256_max_epu32(most, _mm256_loadu_si256((const __m256i*)(row + j)));
  }
  __m128i half = _mm_max_epu32(_mm256_castsi256_si128(most), _mm256_extracti128_si256(most, 1));
  half = _mm_max_epu32(half, _mm_shuffle_epi32(half, _MM_SHUFFLE(1, 0, 3, 2)));
  half = _mm_max_epu32(half, _mm_shuffle_epi32(half, _MM_SHUFFLE(2, 3, 0, 1)));
  const uint32_t folded = (uint32_t)_mm_cvtsi128_si32(half);
  top = folded > top ? folded : top;
  for (; j < c; ++j) {
    uint32_t bits;
    memcpy(&bits, row + j, sizeof(bits));
    top = bits > top ? bits : top;
  }
  return top;
}

// q[j] = rint(row[j] * inv), every value of a quantized row being in 0..255.
LS_INT8_AVX2_TARGET inline void segment_store(const float* row, int64_t c, float inv, uint8_t* q) {
  const __m256 scale = _mm256_set1_ps(inv);
  int64_t j = 0;
  for (; j + kLanes <= c; j += kLanes) {
    const __m256i v = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(row + j), scale));
    const __m128i low = _mm256_castsi256_si128(v), high = _mm256_extracti128_si256(v, 1);
    const __m128i words = _mm_packus_epi32(low, high);
    _mm_storel_epi64((__m128i*)(q + j), _mm_packus_epi16(words, words));
  }
  for (; j < c; ++j) q[j] = (uint8_t)_mm_cvtss_si32(_mm_set_ss(row[j] * inv));
}

// max(0, x) in place, as quantize_u8.h's relu_row (vmaxps returns its second operand, zero, for
// a NaN and for two zeros; the tail's comparison does the same).
LS_INT8_AVX2_TARGET inline void relu_row(float* row, int64_t c) {
  int64_t j = 0;
  for (; j + kLanes <= c; j += kLanes) {
    _mm256_storeu_ps(row + j, _mm256_max_ps(_mm256_loadu_ps(row + j), _mm256_setzero_ps()));
  }
  for (; j < c; ++j) row[j] = row[j] > 0.0f ? row[j] : 0.0f;
}

// quantize_u8.h's quantize_rows: rows [0, n) of a [n, ca] and b [n, cb] (b null when cb is 0)
// into q [n, ca + cb] and scale, after a ReLU in place on a's rows when relu; false when some row
// cannot be quantized (its q and scale then unwritten).
LS_INT8_AVX2_TARGET inline bool quantize_rows(float* a, int64_t ca, const float* b, int64_t cb,
                                              int64_t n, bool relu, uint8_t* q, float* scale) {
  constexpr uint32_t kLargestFinite = 0x7F7FFFFFu;  // FLT_MAX's bit pattern
  const int64_t c = ca + cb;
  bool all = true;
  for (int64_t i = 0; i < n; ++i) {
    float* row = a + i * ca;
    if (relu) relu_row(row, ca);
    uint32_t top = segment_top(row, ca, 0);
    if (cb > 0) top = segment_top(b + i * cb, cb, top);
    if (top > kLargestFinite) {
      all = false;
      continue;
    }
    float most;
    memcpy(&most, &top, sizeof(most));
    const float inv = most > 0.0f ? 255.0f / most : 0.0f;
    scale[i] = most / 255.0f;
    segment_store(row, ca, inv, q + i * c);
    if (cb > 0) segment_store(b + i * cb, cb, inv, q + i * c + ca);
  }
  return all;
}

}  // namespace quantize_u8_avx2
}  // namespace lidarseg
