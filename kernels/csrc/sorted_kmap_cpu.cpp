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

#include <algorithm>
#include <climits>
#include <memory>
#include <vector>

#include "api.h"
#include "cpu_common.h"

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

bool on_range_edge(const int32_t* c) {
  for (int a = 1; a < 4; ++a) {
    if (c[a] == kCoordMin || c[a] == kCoordMax) return true;
  }
  return false;
}

// Packs every row of coords into keys[0, n) and checks them: rows out of the key range and
// duplicates go to err. Returns true when err is clean and the keys are strictly ascending;
// *edge tells whether some coordinate lies on the edge of the key range.
bool pack_sorted_keys(const int32_t* coords, int64_t n, uint64_t* keys, int64_t* err,
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

}  // namespace

LS_API int ls_sorted_submanifold_nbr_cpu(const int32_t* coords, int64_t n, int32_t* nbr,
                                         int64_t* counts, int64_t* applied, int64_t* err) {
  if (n < 0 || n > INT32_MAX) return kStatusBadArgument;
  for (int k = 0; k < kHalfOffsets; ++k) counts[k] = 0;
  *applied = 0;
  // Keys plus sentinels above every real key, so the pointers and the keys they read ahead
  // never run off the end.
  std::unique_ptr<uint64_t[]> keys(new uint64_t[n + kSentinels]);
  bool edge = false;
  if (!pack_sorted_keys(coords, n, keys.get(), err, &edge) || edge) return kStatusOk;
  for (int i = 0; i < kSentinels; ++i) keys[n + i] = kEmptyKey;
  const uint64_t* K = keys.get();
  *applied = 1;
#pragma omp parallel if (n >= kParallelRows)
  {
    int64_t tally[kHalfOffsets] = {0};
    const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t q0 = n * t / threads, q1 = n * (t + 1) / threads;
    int64_t cursor[kColumns];
    for (int col = 0; col < kColumns; ++col) {
      cursor[col] = q0 < q1 ? lower_bound(K, 0, n, K[q0] + kColumnDelta[col] - 1) : 0;
    }
    for (int64_t q = q0; q < q1; ++q) {
      const uint64_t key = K[q];
      for (int col = 0; col < kColumns; ++col) {
        // Targets key + delta + dz for dz = -1, 0, 1 are three consecutive keys.
        const uint64_t below = key + kColumnDelta[col] - 1;
        const int64_t p = advance(K, cursor[col], below);
        cursor[col] = p;
        // K[p] >= below, and the keys are unique and ascending: target below + dz, if present,
        // is one of K[p .. p + dz]. Compares and arithmetic only: no chain of dependent loads
        // and no branch on a hit, which mispredict on a scan's irregular neighbours.
        const uint64_t k0 = K[p], k1 = K[p + 1], k2 = K[p + 2];
        int32_t* out = nbr + 3 * col * n + q;
        for (int dz = 0; dz < 3; ++dz) {
          const uint64_t target = below + dz;
          const int64_t e1 = k1 == target, e2 = k2 == target;
          const int64_t hit = (int64_t)(k0 == target) + e1 + e2;  // 0 or 1
          out[dz * n] = (int32_t)((p + e1 + 2 * e2 + 1) * hit - 1);  // the row, or kMiss
          tally[3 * col + dz] += hit;
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
#pragma omp parallel for schedule(dynamic, 1) if (n * kHalfOffsets >= kParallelRows)
  for (int64_t k = 0; k < kHalfOffsets; ++k) {
    int64_t w = starts[k], m = 2 * total - starts[k + 1];
    for_each_hit_chunk(nbr + k * n, n, [&](const int32_t* in, const int32_t* out, int64_t hits) {
      for (int64_t j = 0; j < hits; ++j) {
        in_idx[w + j] = in[j];
        out_idx[w + j] = out[j];
        in_idx[m + j] = out[j];
        out_idx[m + j] = in[j];
      }
      w += hits;
      m += hits;
    });
  }
  return kStatusOk;
}

// ---- Downsampling with kernel == stride on sorted coordinates ----
//
// Every input row feeds exactly its parent floor(c / stride) through its position inside the
// parent cell, so the map needs no look-up, only the parents in sorted order. Rows with the same
// (batch, floor(x / stride)) are contiguous in sorted input ("slabs"); ordering each slab by
// (parent, position) lists the parents of the slab in ascending order and, per parent, its
// inputs by kernel index. A slab holds up to `stride` x-planes, each sorted by (y, z), so the
// rows of one parent column (floor(y / stride)) are one contiguous block per plane: the planes
// are walked side by side, column by column, and only each column's few rows are sorted.
// Slabs are independent, so threads order contiguous runs of them; one prefix over threads then
// places every thread's outputs and entries.

namespace {

// floor(a / stride): an arithmetic shift where stride is a power of two (every MinkUNet level
// halves), else floor_div. A division costs about 20 cycles and each row needed eight.
struct StrideDivider {
  int32_t stride;
  int shift;  // log2(stride), or -1 when stride is not a power of two
  explicit StrideDivider(int32_t s)
      : stride(s), shift((s & (s - 1)) == 0 ? __builtin_ctz(s) : -1) {}
  int32_t operator()(int32_t a) const { return shift >= 0 ? a >> shift : floor_div(a, stride); }
};

struct SlabEntry {
  uint64_t order;  // parent (y, z fields) then kernel index: ascending = the output order
  int32_t row;
};

// Kernel index of a row inside its parent cell, and the (y, z) part of the parent key.
inline uint64_t slab_order(const int32_t* c, StrideDivider div, int32_t* kernel_index) {
  const int32_t stride = div.stride, px = div(c[1]), py = div(c[2]), pz = div(c[3]);
  *kernel_index = ((c[1] - px * stride) * stride + (c[2] - py * stride)) * stride +
                  (c[3] - pz * stride);
  const uint64_t fields = pack_key(0, 0, py, pz);  // y, z of the parent (biased, 36 bits)
  return fields << 9 | (uint64_t)*kernel_index;    // kernel index < 512 (stride <= 8)
}

// Sorts a column's entries by order: insertion for the few rows a column holds in a LiDAR
// scan, std::sort beyond (dense volumes), so the worst case stays n log n.
void sort_column(SlabEntry* first, SlabEntry* last) {
  constexpr int64_t kInsertionMax = 32;
  if (last - first > kInsertionMax) {
    std::sort(first, last,
              [](const SlabEntry& a, const SlabEntry& b) { return a.order < b.order; });
    return;
  }
  for (SlabEntry* i = first + 1; i < last; ++i) {
    const SlabEntry v = *i;
    SlabEntry* j = i;
    for (; j > first && (j - 1)->order > v.order; --j) *j = *(j - 1);
    *j = v;
  }
}

// Writes the rows [a, b) of one slab (sorted by x, y, z) into e in (parent, kernel index)
// order, tallying entries per kernel index; returns the number of parents.
int64_t order_slab(const int32_t* coords, int64_t a, int64_t b, StrideDivider div, SlabEntry* e,
                   int64_t* tally) {
  int64_t cursor[8], end[8];  // one x-plane each: at most stride <= 8 planes per slab
  int planes = 0;
  for (int64_t i = a; i < b; ++i) {
    if (i == a || coords[4 * i + 1] != coords[4 * i - 3]) {
      if (planes > 0) end[planes - 1] = i;
      cursor[planes++] = i;
    }
  }
  if (planes > 0) end[planes - 1] = b;
  int64_t parents = 0;
  SlabEntry* w = e;
  while (true) {
    int32_t column = INT32_MAX;  // the smallest parent y left in any plane
    bool left = false;
    for (int p = 0; p < planes; ++p) {
      if (cursor[p] < end[p]) {
        left = true;
        column = std::min(column, div(coords[4 * cursor[p] + 2]));
      }
    }
    if (!left) break;
    SlabEntry* first = w;
    for (int p = 0; p < planes; ++p) {
      for (; cursor[p] < end[p] && div(coords[4 * cursor[p] + 2]) == column;
           ++cursor[p], ++w) {
        int32_t k;
        w->row = (int32_t)cursor[p];
        w->order = slab_order(coords + 4 * cursor[p], div, &k);
        ++tally[k];
      }
    }
    sort_column(first, w);
    for (const SlabEntry* j = first; j < w; ++j) {
      parents += j == first || (j->order >> 9) != ((j - 1)->order >> 9);
    }
  }
  return parents;
}

}  // namespace

LS_API int ls_sorted_downsample_cpu(const int32_t* coords, int64_t n, int32_t stride,
                                    int32_t* out_coords, int32_t* in_idx, int32_t* out_idx,
                                    int64_t* counts, int64_t* num_out, int64_t* applied,
                                    int64_t* err) {
  if (n < 0 || n > INT32_MAX || stride < 1 || stride > 8) return kStatusBadArgument;
  const int64_t volume = (int64_t)stride * stride * stride;
  for (int64_t k = 0; k < volume; ++k) counts[k] = 0;
  *num_out = 0;
  *applied = 0;
  std::unique_ptr<uint64_t[]> keys(new uint64_t[n > 0 ? n : 1]);
  bool edge = false;  // floor division never leaves the range: edges are fine here
  if (!pack_sorted_keys(coords, n, keys.get(), err, &edge)) return kStatusOk;
  *applied = 1;
  if (n == 0) return kStatusOk;
  // Slab starts: rows where (batch, floor(x / stride)) changes.
  std::vector<int64_t> slab_start;
  const StrideDivider div(stride);
  slab_start.push_back(0);
  for (int64_t i = 1; i < n; ++i) {
    const int32_t* c = coords + 4 * i;
    const int32_t* p = c - 4;
    if (c[0] != p[0] || div(c[1]) != div(p[1])) slab_start.push_back(i);
  }
  const int64_t num_slabs = (int64_t)slab_start.size();
  slab_start.push_back(n);
  std::unique_ptr<SlabEntry[]> sorted(new SlabEntry[n]);
  const int threads = n >= kParallelRows ? omp_get_max_threads() : 1;
  // Per thread: outputs, and entries per kernel index, of its run of slabs.
  std::vector<int64_t> outputs(threads + 1, 0), tally((threads + 1) * volume, 0);
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t s0 = num_slabs * t / nt, s1 = num_slabs * (t + 1) / nt;
    int64_t* mine = &tally[(t + 1) * volume];
    for (int64_t s = s0; s < s1; ++s) {
      outputs[t + 1] += order_slab(coords, slab_start[s], slab_start[s + 1], div,
                                   sorted.get() + slab_start[s], mine);
    }
#pragma omp barrier
#pragma omp single
    {
      // Exclusive prefixes: outputs over threads; entries over kernel index, then threads.
      for (int u = 0; u < nt; ++u) outputs[u + 1] += outputs[u];
      int64_t start = 0;
      for (int64_t k = 0; k < volume; ++k) {
        for (int u = 0; u < nt; ++u) {
          const int64_t c = tally[(u + 1) * volume + k];
          tally[u * volume + k] = start;  // row u now holds thread u's first entry of k
          start += c;
          counts[k] += c;
        }
      }
      *num_out = outputs[nt];
    }
    int64_t* cursor = &tally[t * volume];
    std::vector<int64_t> cur(cursor, cursor + volume);
    int64_t o = outputs[t] - 1;
    for (int64_t s = s0; s < s1; ++s) {
      const SlabEntry* e = sorted.get() + slab_start[s];
      const int64_t m = slab_start[s + 1] - slab_start[s];
      for (int64_t j = 0; j < m; ++j) {
        const int32_t* c = coords + 4 * e[j].row;
        if (j == 0 || (e[j].order >> 9) != (e[j - 1].order >> 9)) {
          int32_t* dst = out_coords + 4 * ++o;
          dst[0] = c[0];
          dst[1] = div(c[1]);
          dst[2] = div(c[2]);
          dst[3] = div(c[3]);
        }
        const int64_t k = (int64_t)(e[j].order & 511);
        in_idx[cur[k]] = e[j].row;
        out_idx[cur[k]] = (int32_t)o;
        ++cur[k];
      }
    }
  }
  return kStatusOk;
}
