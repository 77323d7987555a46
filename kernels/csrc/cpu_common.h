// Helpers shared by the CPU kernels (*_cpu.cpp) only.
#pragma once
#include <stdint.h>

#include "common.h"

namespace lidarseg {

// Below this many rows a parallel region costs more than the work (the deep levels of a UNet).
constexpr int64_t kParallelRows = 4096;

// Whether err (common.h: report_error) holds an error yet.
inline bool has_error(const int64_t* err) {
  return (uint64_t)__atomic_load_n(err, __ATOMIC_RELAXED) != kNoError;
}

// Calls emit(in, out, m) for each chunk of the hits (v >= 0) of row[0, n), in order: in[j] is a
// hit's value and out[j] its position. Hits and misses alternate unpredictably, so the loop has
// no branch on them: every entry goes to a small staging buffer and the cursor only advances past
// hits.
template <typename Emit>
inline void for_each_hit_chunk(const int32_t* row, int64_t n, Emit emit) {
  constexpr int64_t kChunk = 512;
  int32_t in_buf[kChunk], out_buf[kChunk];
  for (int64_t q0 = 0; q0 < n; q0 += kChunk) {
    const int64_t q1 = (n - q0 < kChunk) ? n : q0 + kChunk;
    int64_t m = 0;
    for (int64_t q = q0; q < q1; ++q) {
      const int32_t v = row[q];
      in_buf[m] = v;
      out_buf[m] = (int32_t)q;
      m += v >= 0;
    }
    emit(in_buf, out_buf, m);
  }
}

// lower_bound (first position in sorted[lo, hi) whose value is >= v): common.h, shared with CUDA.

// lower_bound for a value expected a short way past lo: steps of 1, 2, 4, ... from lo find a
// range that holds it, then a binary search inside; the reads stay near lo (cached), where a
// search over the whole range starts with reads far apart.
template <typename T, typename V>
inline int64_t gallop_lower_bound(const T* sorted, int64_t lo, int64_t hi, V v) {
  int64_t step = 1;
  while (lo + step < hi && sorted[lo + step - 1] < v) {
    lo += step;
    step *= 2;
  }
  return lower_bound(sorted, lo, lo + step < hi ? lo + step : hi, v);
}

// lower_bound of v in sorted[lo, hi) searched from a guess of where it is: steps of 1, 2, 4,
// ... away from the guess, up or down, then a binary search. A good guess (rows spread evenly
// over a sorted index) costs two or three reads where a gallop from lo costs twice log2 of the
// distance.
template <typename T, typename V>
inline int64_t lower_bound_near(const T* sorted, int64_t lo, int64_t hi, int64_t guess, V v) {
  const int64_t g = guess < lo ? lo : guess > hi ? hi : guess;
  if (g < hi && sorted[g] < v) return gallop_lower_bound(sorted, g + 1, hi, v);
  int64_t b = g, step = 1;  // the answer is in [lo, b]: sorted[b] >= v, or b == hi
  while (b - step >= lo && sorted[b - step] >= v) {
    b -= step;
    step *= 2;
  }
  return lower_bound(sorted, b - step >= lo ? b - step + 1 : lo, b, v);
}

}  // namespace lidarseg
