// Packing sorted coordinates into keys, shared by the two sorted-coordinate map builders
// (sorted_kmap_cpu.cpp: submanifold merge joins; sorted_downsample_cpu.cpp: downsampling).
// Host only.
#pragma once
#include <omp.h>
#include <stdint.h>

#include "cpu_common.h"

namespace lidarseg {

inline bool on_range_edge(const int32_t* c) {
  for (int a = 1; a < 4; ++a) {
    if (c[a] == kCoordMin || c[a] == kCoordMax) return true;
  }
  return false;
}

// Packs every row of coords into keys[0, n) and checks them: rows out of the key range and
// duplicates go to err. Returns true when err is clean and the keys are strictly ascending;
// *edge tells whether some coordinate lies on the edge of the key range.
inline bool pack_sorted_keys(const int32_t* coords, int64_t n, uint64_t* keys, int64_t* err,
                             bool* edge) {
  int declined = 0, on_edge = 0;
#pragma omp parallel for schedule(static) reduction(| : on_edge) if (n >= kParallelRows)
  for (int64_t i = 0; i < n; ++i) {
    const int32_t* c = coords + 4 * i;
    if (!coord_in_range(c[0], c[1], c[2], c[3])) {
      report_error(err, kStatusOutOfRange, i);
      keys[i] = 0;
      continue;
    }
    on_edge |= on_range_edge(c);
    keys[i] = pack_key(c[0], c[1], c[2], c[3]);
  }
  *edge = on_edge;
  if (has_error(err)) return false;
#pragma omp parallel for schedule(static) reduction(| : declined) if (n >= kParallelRows)
  for (int64_t i = 1; i < n; ++i) {
    if (keys[i] == keys[i - 1]) report_error(err, kStatusDuplicate, i);
    declined |= keys[i] < keys[i - 1];
  }
  return !has_error(err) && !declined;
}

}  // namespace lidarseg
