// Downsampling maps with kernel == stride on coordinates sorted by (batch, x, y, z): no hash
// table, no look-up (see below). Host only; the submanifold twin is sorted_kmap_cpu.cpp.
#include <omp.h>

#include <algorithm>
#include <climits>
#include <memory>
#include <vector>

#include "api.h"
#include "cpu_common.h"
#include "sorted_keys.h"

using namespace lidarseg;

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
