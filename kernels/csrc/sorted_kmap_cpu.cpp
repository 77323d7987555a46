// Submanifold kernel-3 maps of coordinates sorted by (batch, x, y, z): merge joins, no hashing.
//
// Packed keys (common.h) order exactly like (batch, x, y, z), and for an offset d whose target
// stays inside the key range, key(q + d) = key(q) + delta(d) with one constant delta(d). Adding a
// constant keeps order, so when the rows are sorted, the neighbours of q = 0, 1, 2, ... through d
// sit at non-decreasing rows: one forward pointer per offset finds them all in a single pass,
// reading the keys sequentially (no probe, no random cache line). The three offsets that differ
// only in dz (-1, 0, +1) share a pointer, since their targets are consecutive keys; the half
// offsets (kernel indices 0..12) take four such columns plus dz = -1 on the row itself.
//
// The same ordering makes the mirror half free: the entries of d sorted by output q are also
// sorted by input p = q + d, so the map of -d is the map of d with in and out swapped, in the
// same order (ls_submanifold_compact_sorted_cpu writes both halves in one pass).
#include <omp.h>

#include <climits>
#include <memory>

#include "api.h"
#include "cpu_common.h"

using namespace lidarseg;

namespace {

constexpr int kHalfOffsets = 13;  // kernel indices 0..12 of a 3x3x3 kernel, before the centre
constexpr int kColumns = 4;       // (dx, dy) = (-1, -1), (-1, 0), (-1, 1), (0, -1)

// Key delta of (dx, dy, 0) for each column, and of dz = -1 (the last half offset).
constexpr int64_t kStepX = 1ll << (2 * kCoordBits), kStepY = 1ll << kCoordBits;
constexpr int64_t kColumnDelta[kColumns] = {-kStepX - kStepY, -kStepX, -kStepX + kStepY, -kStepY};

bool on_range_edge(const int32_t* c) {
  for (int a = 1; a < 4; ++a) {
    if (c[a] == kCoordMin || c[a] == kCoordMax) return true;
  }
  return false;
}

// First index in keys[0, n) whose key is >= target (keys ascending).
int64_t lower_bound(const uint64_t* keys, int64_t n, uint64_t target) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (keys[mid] < target) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

}  // namespace

LS_API int ls_sorted_submanifold_nbr_cpu(const int32_t* coords, int64_t n, int32_t* nbr,
                                         int64_t* counts, int64_t* applied, int64_t* err) {
  if (n < 0 || n > INT32_MAX) return kStatusBadArgument;
  for (int k = 0; k < kHalfOffsets; ++k) counts[k] = 0;
  *applied = 0;
  // Keys plus three sentinels above every real key, so the pointers never run off the end.
  std::unique_ptr<uint64_t[]> keys(new uint64_t[n + 3]);
  int declined = 0;
#pragma omp parallel for schedule(static) reduction(| : declined) if (n >= kParallelRows)
  for (int64_t i = 0; i < n; ++i) {
    const int32_t* c = coords + 4 * i;
    if (!coord_in_range(c[0], c[1], c[2], c[3])) {
      report_error(err, kStatusOutOfRange, i);
      keys[i] = 0;
      continue;
    }
    declined |= on_range_edge(c);
    keys[i] = pack_key(c[0], c[1], c[2], c[3]);
  }
  if (__atomic_load_n(&err[0], __ATOMIC_RELAXED) != 0) return kStatusOk;  // the caller reads err
  for (int i = 0; i < 3; ++i) keys[n + i] = kEmptyKey;
  const uint64_t* K = keys.get();
#pragma omp parallel for schedule(static) reduction(| : declined) if (n >= kParallelRows)
  for (int64_t i = 1; i < n; ++i) {
    if (K[i] == K[i - 1]) report_error(err, kStatusDuplicate, i);
    declined |= K[i] < K[i - 1];
  }
  if (__atomic_load_n(&err[0], __ATOMIC_RELAXED) != 0 || declined) return kStatusOk;
  *applied = 1;
#pragma omp parallel if (n >= kParallelRows)
  {
    int64_t tally[kHalfOffsets] = {0};
    const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t q0 = n * t / threads, q1 = n * (t + 1) / threads;
    int64_t cursor[kColumns];
    for (int col = 0; col < kColumns; ++col) {
      cursor[col] = q0 < q1 ? lower_bound(K, n, K[q0] + kColumnDelta[col] - 1) : 0;
    }
    for (int64_t q = q0; q < q1; ++q) {
      const uint64_t key = K[q];
      for (int col = 0; col < kColumns; ++col) {
        // Targets key + delta + dz for dz = -1, 0, 1 are three consecutive keys.
        const uint64_t below = key + kColumnDelta[col] - 1;
        int64_t p = cursor[col];
        while (K[p] < below) ++p;
        cursor[col] = p;
        int32_t* out = nbr + 3 * col * n + q;
        for (int dz = 0; dz < 3; ++dz) {
          const bool hit = K[p] == below + dz;
          out[dz * n] = hit ? (int32_t)p : kMiss;
          tally[3 * col + dz] += hit;
          p += hit;
        }
      }
      const bool hit = q > 0 && K[q - 1] == key - 1;  // (0, 0, -1): the row just before
      nbr[(kHalfOffsets - 1) * n + q] = hit ? (int32_t)(q - 1) : kMiss;
      tally[kHalfOffsets - 1] += hit;
    }
    for (int k = 0; k < kHalfOffsets; ++k) {
      if (tally[k]) __atomic_fetch_add(&counts[k], tally[k], __ATOMIC_RELAXED);
    }
  }
  return kStatusOk;
}

LS_API int ls_submanifold_compact_sorted_cpu(const int32_t* nbr, int64_t n,
                                             const int64_t* starts, int32_t* in_idx,
                                             int32_t* out_idx) {
  // starts[0..13]: prefix sums of the half counts; the mirror of kernel index k (index 26 - k)
  // follows the half in reverse kernel order, so it begins at 2 * total - starts[k + 1].
  const int64_t total = starts[kHalfOffsets];
  constexpr int64_t kChunk = 512;
#pragma omp parallel for schedule(dynamic, 1) if (n * kHalfOffsets >= kParallelRows)
  for (int64_t k = 0; k < kHalfOffsets; ++k) {
    const int32_t* row = nbr + k * n;
    int64_t w = starts[k], m = 2 * total - starts[k + 1];
    int32_t in_buf[kChunk], out_buf[kChunk];
    for (int64_t q0 = 0; q0 < n; q0 += kChunk) {
      const int64_t q1 = (n - q0 < kChunk) ? n : q0 + kChunk;
      int64_t hits = 0;
      for (int64_t q = q0; q < q1; ++q) {  // branch-free: the cursor only passes hits
        const int32_t v = row[q];
        in_buf[hits] = v;
        out_buf[hits] = (int32_t)q;
        hits += v >= 0;
      }
      for (int64_t j = 0; j < hits; ++j) {
        in_idx[w + j] = in_buf[j];
        out_idx[w + j] = out_buf[j];
        in_idx[m + j] = out_buf[j];
        out_idx[m + j] = in_buf[j];
      }
      w += hits;
      m += hits;
    }
  }
  return kStatusOk;
}
