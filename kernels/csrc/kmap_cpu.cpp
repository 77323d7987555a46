// CPU kernel-map utilities that are not hashing: ordering each offset's entries by output row.
#include <omp.h>

#include <cstddef>
#include <vector>

#include "api.h"

// For each kernel index k, stably reorders the entries [bounds[k], bounds[k+1]) by out_idx
// (counting sort over [0, num_out)), writing the result to in_sorted / out_sorted.
LS_API int ls_sort_entries_by_out_cpu(const int32_t* in_idx, const int32_t* out_idx,
                                      const int64_t* bounds, int64_t num_kernels, int64_t num_out,
                                      int32_t* in_sorted, int32_t* out_sorted) {
  if (num_kernels < 0 || num_out < 0) return lidarseg::kStatusBadArgument;
  int bad = 0;
#pragma omp parallel for schedule(dynamic, 1) reduction(| : bad)
  for (int64_t k = 0; k < num_kernels; ++k) {
    const int64_t lo = bounds[k], hi = bounds[k + 1];
    if (hi - lo < 2) {
      for (int64_t e = lo; e < hi; ++e) {
        bad |= out_idx[e] < 0 || out_idx[e] >= num_out;  // checked as the longer segments are
        in_sorted[e] = in_idx[e];
        out_sorted[e] = out_idx[e];
      }
      continue;
    }
    // Already ascending and in range (a stride-2 downsampling's map transposed: per offset,
    // parents and children come in the same order): a copy.
    bool ascending = out_idx[lo] >= 0 && out_idx[hi - 1] < num_out;
    for (int64_t e = lo + 1; e < hi && ascending; ++e) ascending = out_idx[e - 1] < out_idx[e];
    if (ascending) {
      for (int64_t e = lo; e < hi; ++e) {
        in_sorted[e] = in_idx[e];
        out_sorted[e] = out_idx[e];
      }
      continue;
    }
    // Segments hold distinct outputs, so "sorting" is placing each entry by its output's rank.
    std::vector<int32_t> slot((std::size_t)num_out, -1);
    for (int64_t e = lo; e < hi; ++e) {
      const int32_t o = out_idx[e];
      if (o < 0 || o >= num_out) {
        bad = 1;
        continue;
      }
      slot[(std::size_t)o] = (int32_t)(e - lo);
    }
    int64_t w = lo;
    for (int64_t o = 0; o < num_out; ++o) {
      const int32_t e = slot[(std::size_t)o];
      if (e < 0) continue;
      in_sorted[w] = in_idx[lo + e];
      out_sorted[w] = (int32_t)o;
      ++w;
    }
    if (w != hi) bad = 1;  // an output appeared twice in one offset
  }
  return bad ? lidarseg::kStatusBadArgument : lidarseg::kStatusOk;
}
