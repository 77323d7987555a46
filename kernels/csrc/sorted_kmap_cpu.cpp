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
// same order (ls_sorted_submanifold_map_cpu writes a half offset's hits and their mirrors at
// once).
#include <omp.h>

#include <algorithm>
#include <climits>
#include <memory>
#include <vector>

#include "api.h"
#include "cpu_common.h"
#include "sorted_keys.h"

using namespace lidarseg;

namespace {

constexpr int kHalfOffsets = 13;  // kernel indices 0..12 of a 3x3x3 kernel, before the centre
constexpr int kColumns = 4;       // (dx, dy) = (-1, -1), (-1, 0), (-1, 1), (0, -1)

// Key delta of (dx, dy, 0) for each column, and of dz = -1 (the last half offset).
constexpr int64_t kStepX = 1ll << (2 * kCoordBits), kStepY = 1ll << kCoordBits;
constexpr int64_t kColumnDelta[kColumns] = {-kStepX - kStepY, -kStepX, -kStepX + kStepY, -kStepY};

constexpr int kLookAhead = 4;              // keys a pointer compares at once as it advances
constexpr int kSentinels = kLookAhead + 2;  // so that K[p + kLookAhead + 1] always exists
static_assert(kMiss == -1, "the merge join writes a miss as (row + 1) * 0 - 1");

// The first position at or after p whose key is not below `below`. A pointer moves a row or
// two per output row: four keys are compared at once (no branch), a loop takes longer jumps.
inline int64_t advance(const uint64_t* K, int64_t p, uint64_t below) {
  int64_t steps = 0;
  for (int i = 0; i < kLookAhead; ++i) steps += K[p + i] < below;
  p += steps;
  if (steps == kLookAhead) {
    while (K[p] < below) ++p;
  }
  return p;
}

// Keys plus sentinels above every real key, so the pointers and the keys they read ahead never
// run off the end; false (nothing to do: the caller takes another path, or err is set) unless
// coords are strictly ascending with none on the edge of the key range.
bool sorted_keys(const int32_t* coords, int64_t n, std::unique_ptr<uint64_t[]>& keys,
                 int64_t* err) {
  keys.reset(new uint64_t[n + kSentinels]);
  bool edge = false;
  if (!pack_sorted_keys(coords, n, keys.get(), err, &edge) || edge) return false;
  for (int i = 0; i < kSentinels; ++i) keys[n + i] = kEmptyKey;
  return true;
}

// The merge join of rows [q0, q1) through column col (kernel indices 3 * col + dz): emit(dz, q,
// row, hit) for dz = 0, 1, 2 of each row q, row being q's neighbour (hit 1) or kMiss (hit 0).
// One column at a time, so a caller keeps one pointer and three output streams in registers
// (all four columns in one loop kept thirteen streams and their counts in memory).
template <typename Emit>
inline void join_column(const uint64_t* K, int64_t n, int64_t q0, int64_t q1, int col,
                        Emit&& emit) {
  if (q0 >= q1) return;
  const uint64_t delta = (uint64_t)kColumnDelta[col];
  int64_t p = lower_bound(K, 0, n, K[q0] + delta - 1);
  for (int64_t q = q0; q < q1; ++q) {
    // Targets key + delta + dz for dz = -1, 0, 1 are three consecutive keys.
    const uint64_t below = K[q] + delta - 1;
    p = advance(K, p, below);
    // K[p] >= below, and the keys are unique and ascending: target below + dz, if present,
    // is one of K[p .. p + dz]. Compares and arithmetic only: no chain of dependent loads
    // and no branch on a hit, which mispredict on a scan's irregular neighbours.
    const uint64_t k0 = K[p], k1 = K[p + 1], k2 = K[p + 2];
    for (int dz = 0; dz < 3; ++dz) {
      const uint64_t target = below + dz;
      const int64_t e1 = k1 == target, e2 = k2 == target;
      const int64_t hit = (int64_t)(k0 == target) + e1 + e2;  // 0 or 1
      emit(dz, q, (int32_t)((p + e1 + 2 * e2 + 1) * hit - 1), hit);  // row, kMiss
    }
  }
}

// The last half offset, (0, 0, -1), of rows [q0, q1): the row just before, if it is key - 1.
template <typename Emit>
inline void join_previous(const uint64_t* K, int64_t q0, int64_t q1, Emit&& emit) {
  for (int64_t q = q0; q < q1; ++q) {
    const int64_t hit = q > 0 && K[q - 1] == K[q] - 1;
    emit(q, hit ? (int32_t)(q - 1) : kMiss, hit);
  }
}

// Every half offset k of rows [q0, q1): emit(k, q, row, hit), column by column.
template <typename Emit>
inline void merge_join(const uint64_t* K, int64_t n, int64_t q0, int64_t q1, Emit&& emit) {
  for (int col = 0; col < kColumns; ++col) {
    join_column(K, n, q0, q1, col, [&](int dz, int64_t q, int32_t row, int64_t hit) {
      emit(3 * col + dz, q, row, hit);
    });
  }
  join_previous(K, q0, q1, [&](int64_t q, int32_t row, int64_t hit) {
    emit(kHalfOffsets - 1, q, row, hit);
  });
}

// Writes the pair (row, q) at position `count` of a stream of pairs and counts it only when it
// is a hit: every pair is written, so there is no branch on a hit.
inline void append_pair(int32_t* pairs, int64_t& count, int32_t row, int64_t q, int64_t hit) {
  int32_t* w = pairs + 2 * count;
  w[0] = row;
  w[1] = (int32_t)q;
  count += hit;
}

}  // namespace

LS_API int ls_sorted_submanifold_nbr_cpu(const int32_t* coords, int64_t n, int32_t* nbr,
                                         int64_t* counts, int64_t* applied, int64_t* err) {
  if (n < 0 || n > INT32_MAX) return kStatusBadArgument;
  for (int k = 0; k < kHalfOffsets; ++k) counts[k] = 0;
  *applied = 0;
  std::unique_ptr<uint64_t[]> keys;
  if (!sorted_keys(coords, n, keys, err)) return kStatusOk;
  *applied = 1;
#pragma omp parallel if (n >= kParallelRows)
  {
    int64_t tally[kHalfOffsets] = {0};
    const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
    merge_join(keys.get(), n, n * t / threads, n * (t + 1) / threads,
               [&](int k, int64_t q, int32_t row, int64_t hit) {
                 nbr[k * n + q] = row;
                 tally[k] += hit;
               });
    for (int k = 0; k < kHalfOffsets; ++k) {
      if (tally[k]) __atomic_fetch_add(&counts[k], tally[k], __ATOMIC_RELAXED);
    }
  }
  return kStatusOk;
}

LS_API int ls_sorted_submanifold_map_cpu(const int32_t* coords, int64_t n, int32_t* in_idx,
                                         int32_t* out_idx, int64_t capacity, int64_t* counts,
                                         int64_t* applied, int64_t* err) {
  if (n < 0 || n > INT32_MAX || capacity < 2 * kHalfOffsets * n) return kStatusBadArgument;
  for (int k = 0; k < kHalfOffsets; ++k) counts[k] = 0;
  *applied = 0;
  std::unique_ptr<uint64_t[]> keys;
  if (!sorted_keys(coords, n, keys, err)) return kStatusOk;
  *applied = 1;
  const int threads = n >= kParallelRows ? omp_get_max_threads() : 1;
  // where[t][k]: thread t's first entry of half offset k in the map, once the hits are
  // counted; starts[k]: offset k's first
  std::vector<int64_t> where((int64_t)threads * kHalfOffsets, 0), starts(kHalfOffsets + 1, 0);
#pragma omp parallel num_threads(threads)
  {
    const int nt = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t q0 = n * t / nt, q1 = n * (t + 1) / nt, rows = q1 - q0;
    // (in, out) pairs of this thread's hits, per offset (at most one a row): every pair is
    // written and the count advances only past hits, so no branch on them
    std::unique_ptr<int32_t[]> pairs(new int32_t[2 * kHalfOffsets * (rows > 0 ? rows : 1)]);
    int64_t found[kHalfOffsets] = {0};
    int32_t* const stream = pairs.get();  // offset k's pairs from 2 * k * rows
    for (int col = 0; col < kColumns; ++col) {
      int64_t hits[3] = {0, 0, 0};  // locals, so they stay in registers
      join_column(keys.get(), n, q0, q1, col, [&](int dz, int64_t q, int32_t row, int64_t hit) {
        append_pair(stream + 2 * (3 * col + dz) * rows, hits[dz], row, q, hit);
      });
      for (int dz = 0; dz < 3; ++dz) found[3 * col + dz] = hits[dz];
    }
    join_previous(keys.get(), q0, q1, [&](int64_t q, int32_t row, int64_t hit) {
      append_pair(stream + 2 * (kHalfOffsets - 1) * rows, found[kHalfOffsets - 1], row, q, hit);
    });
    for (int k = 0; k < kHalfOffsets; ++k) where[(int64_t)t * kHalfOffsets + k] = found[k];
#pragma omp barrier
#pragma omp single
    {
      int64_t total = 0;
      for (int k = 0; k < kHalfOffsets; ++k) {  // offsets in kernel order, threads in row order
        starts[k] = total;
        for (int u = 0; u < nt; ++u) {
          const int64_t c = where[(int64_t)u * kHalfOffsets + k];
          where[(int64_t)u * kHalfOffsets + k] = total;
          total += c;
          counts[k] += c;
        }
      }
      starts[kHalfOffsets] = total;
    }
    // Offset k's hits at their place, and the same pairs swapped as its mirror 26 - k, which
    // follows the half in reverse kernel order (from 2 * total - starts[k + 1]): rows sorted by
    // q are sorted by q + d too, so the mirror is in order.
    const int64_t total = starts[kHalfOffsets];
    for (int k = 0; k < kHalfOffsets; ++k) {
      const int64_t w = where[(int64_t)t * kHalfOffsets + k];
      const int64_t m = 2 * total - starts[k + 1] + (w - starts[k]);
      const int32_t* src = pairs.get() + 2 * k * rows;
      for (int64_t j = 0; j < found[k]; ++j) {
        in_idx[w + j] = out_idx[m + j] = src[2 * j];
        out_idx[w + j] = in_idx[m + j] = src[2 * j + 1];
      }
    }
  }
  return kStatusOk;
}
