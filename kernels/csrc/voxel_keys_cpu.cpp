// The voxelizer's keys pass (app/inference/voxelize.py): validity, cells, packed keys, runs
// and the runs' block keys for Open3D's hash set, in one pass over the points. Host only, without
// a CUDA twin: the voxelizer runs on the host, where Open3D's hash set finds the occupied blocks
// of voxels (voxel_order_cpu.cpp orders what it finds). The pass runs in parts on several
// threads and gives the keys, runs and block keys that one pass in point order gives.
//
// The whole file without trapping math (before any include, so that <cmath>'s inline functions
// take it too): GCC then vectorizes the float -> int conversions, which it keeps scalar while
// they may set FP exception flags (nothing here reads them; values are unchanged).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "api.h"
#include "cpu_common.h"
#include "voxel_blocks.h"
#include "voxel_keys.h"
#include "voxel_points.h"

using namespace lidarseg;
using namespace lidarseg::voxel;

namespace {

// counts[]: two tallies, the runs, the block rows
enum Count { kNonFinite = 0, kOutOfRange = 1, kRuns = 2, kBlockRows = 3 };

// One contiguous part of the points in the keys pass: its runs are written from run_keys[begin]
// and block_run[begin] on and numbered from 0 in run_of_point, its block keys from row begin of
// block_words on, numbered from 0 in block_run; merged into one numbering afterwards.
struct KeysPart {
  int64_t begin = 0, end = 0, runs = 0, rows = 0, non_finite = 0, out_of_range = 0;
  int64_t first_key = -1, last_key = -1;
  int64_t bad = -1;  // the first point outside the caller's grid
};

// A point's key in keys_of_part's first loop, or why it has none.
constexpr int64_t kKeyNotFinite = -1, kKeyOutside = -2, kKeyOffGrid = -3;

// floor(q) clamped to +-1e9 (beyond any cell field); NaN gives -1e9. Comparisons and selects
// only, which the vectorizer turns into blends; converted to int32 and widened (AVX2 has no
// float -> int64 conversion: through int64 the loops stayed scalar on AVX2-only CPUs).
inline int64_t clamped_floor(float q) {
  constexpr float kFar = 1e9f;
  const float f = std::floor(q);
  const float high = f < kFar ? f : kFar;
  return (int64_t)(int32_t)(high > -kFar ? high : -kFar);
}

// The key (or kKey* code) of a point at x, y, z: no branch, so the loops that call it vectorize
// (the divisions most of all). A kept point's cell must lie in [0, 2^limit[a]) on each axis.
inline int64_t point_key(float px, float py, float pz, const float* params, const int32_t* origin,
                         const int64_t* limit, int64_t batch_bits) {
  const PointRule rule(px, py, pz, params);
  // floor(v / voxel) - origin (float32 division), the floor clamped first so that any point's
  // converts to int64 (a kept point's clamped cell is still off the grid, a kKeyOffGrid)
  const float voxel = params[0];
  const int64_t x = clamped_floor(px / voxel) - origin[0];
  const int64_t y = clamped_floor(py / voxel) - origin[1];
  const int64_t z = clamped_floor(pz / voxel) - origin[2];
  const bool on_grid = ((x | y | z) >= 0) & ((x >> limit[0]) == 0) & ((y >> limit[1]) == 0) &
                       ((z >> limit[2]) == 0);
  const int64_t packed = batch_bits | x << (2 * kAxisBits) | y << kAxisBits | z;
  const int64_t why = rule.finite ? kKeyOutside : kKeyNotFinite;
  const int64_t kept_key = on_grid ? packed : kKeyOffGrid;
  return rule.kept() ? kept_key : why;
}

// The keys of points [begin, end) (at most kChunkRows) into key[0 .. end - begin). kCols 3 or
// 4: rows of that many columns, read in place (a stride the compiler knows: it vectorizes the
// loads). Other layouts are first copied into an XyzChunk.
template <int kCols>
void chunk_keys(const float* points, int64_t cols, const float* params, const int32_t* origin,
                const int64_t* limit, int64_t batch_bits, int64_t begin, int64_t end,
                int64_t* key) {
  if (kCols == 3 || kCols == 4) {
    const float* p = points + begin * kCols;
    for (int64_t i = 0; i < end - begin; ++i, p += kCols) {
      key[i] = point_key(p[0], p[1], p[2], params, origin, limit, batch_bits);
    }
    return;
  }
  XyzChunk xyz;
  xyz.copy(points + begin * cols, cols, end - begin);
  for (int64_t i = 0; i < end - begin; ++i) {
    key[i] = point_key(xyz.x[i], xyz.y[i], xyz.z[i], params, origin, limit, batch_bits);
  }
}

// The pass's outputs, each part writing from its own begin on.
struct KeysOut {
  int64_t* run_keys;
  int32_t* run_of_point;
  int32_t* block_run;
  int32_t* block_words;
};

void keys_of_part(const float* points, int64_t cols, const float* params, const int32_t* origin,
                  const BlockLayout& layout, int64_t batch_bits, const KeysOut& out,
                  KeysPart& part) {
  constexpr int64_t kChunk = kChunkRows;
  int64_t key[kChunk];
  int64_t* keys = out.run_keys + part.begin;
  int32_t* block_run = out.block_run + part.begin;
  BlockRows rows(layout, out.block_words + part.begin * layout.words);
  int64_t runs = 0, last = -1, non_finite = 0, out_of_range = 0;
  for (int64_t begin = part.begin; begin < part.end; begin += kChunk) {
    const int64_t end = std::min(begin + kChunk, part.end);
    by_columns(cols, [&](auto columns) {
      chunk_keys<decltype(columns)::value>(points, cols, params, origin, layout.limit,
                                           batch_bits, begin, end, key);
    });
    for (int64_t i = begin; i < end; ++i) {
      const int64_t k = key[i - begin];
      if (k < 0) {  // rare in a scan: the branch predicts well
        if (k == kKeyOffGrid) {  // the caller's origin does not cover its range
          part.bad = i;
          return;
        }
        non_finite += k == kKeyNotFinite;
        out_of_range += k == kKeyOutside;
        out.run_of_point[i] = -1;
        continue;
      }
      // A scan often repeats a voxel, but not in a pattern a branch predicts (KITTI: 66,060
      // runs of 124,668 points): a new run is counted and its key and block row stored without
      // a branch (the stores land in the slot of the run in progress, at most point i's own).
      // Consecutive points mostly share a block (KITTI at 0.1 m: 920 block rows).
      const int32_t row = rows.row_of(layout.key_of(k));
      runs += k != last;  // last is -1 before the first kept point
      keys[runs - 1] = k;
      block_run[runs - 1] = row;
      last = k;
      out.run_of_point[i] = (int32_t)(runs - 1);
    }
  }
  part.first_key = runs > 0 ? keys[0] : -1;
  part.runs = runs;
  part.rows = rows.rows();
  part.last_key = last;
  part.non_finite = non_finite;
  part.out_of_range = out_of_range;
}

// Where merge_parts put a part's runs and block rows: runs [run_begin, run_end) of the numbering,
// its run 0 at run_zero (run_begin - 1 where that run was merged into the part before), its
// block row 0 at row_zero.
struct PartPlace {
  int64_t run_zero = 0, run_begin = 0, run_end = 0, row_zero = 0;
};

// Moves each part's runs and block rows after those of the parts before it (a run that spans
// two parts merged back into one); returns {runs, block rows}.
std::pair<int64_t, int64_t> merge_parts(const std::vector<KeysPart>& parts,
                                        const BlockLayout& layout, const KeysOut& out,
                                        std::vector<PartPlace>& places) {
  int64_t runs = 0, rows = 0, last = -1;
  for (size_t c = 0; c < parts.size(); ++c) {
    const KeysPart& part = parts[c];
    if (part.runs == 0) continue;
    const int64_t merged = (runs > 0 && part.first_key == last) ? 1 : 0;
    const int64_t moved = part.runs - merged;  // runs <= part.begin: moves go down
    places[c] = PartPlace{runs - merged, runs, runs + moved, rows};
    std::memmove(out.run_keys + runs, out.run_keys + part.begin + merged, 8 * moved);
    std::memmove(out.block_run + runs, out.block_run + part.begin + merged, 4 * moved);
    std::memmove(out.block_words + rows * layout.words,
                 out.block_words + part.begin * layout.words, 4 * part.rows * layout.words);
    runs += moved;
    rows += part.rows;  // a merged run's row stays: a copy of a key the hash set already has
    last = part.last_key;
  }
  return {runs, rows};
}

}  // namespace

LS_API int ls_voxel_keys_cpu(const float* points, int64_t n, int64_t cols, const float* params,
                             const int32_t* origin, const int32_t* block, int64_t batch,
                             int64_t first_run, int64_t first_row, int64_t* run_keys,
                             int32_t* run_of_point, int32_t* block_run, int32_t* block_words,
                             int64_t* counts, int64_t* err) {
  BlockLayout layout;
  if (n < 0 || n > INT32_MAX || cols < 3 || batch < 0 ||
      batch >= (int64_t(1) << (63 - kBatchShift)) || first_run < 0 || first_row < 0 ||
      first_run + n > INT32_MAX || first_row + n > INT32_MAX || !layout.set(block, batch)) {
    return kStatusBadArgument;
  }
  // Parts in parallel, then one numbering: runs, keys and block rows are those of one pass in
  // point order, whatever the thread count.
  const int num_parts = parts_for(n);
  std::vector<KeysPart> parts(num_parts);
  for (int c = 0; c < num_parts; ++c) {
    parts[c].begin = n * c / num_parts;
    parts[c].end = n * (c + 1) / num_parts;
  }
  const KeysOut out{run_keys, run_of_point, block_run, block_words};
  const int64_t batch_bits = batch << kBatchShift;
#pragma omp parallel for schedule(static) if (num_parts > 1)
  for (int c = 0; c < num_parts; ++c) {
    keys_of_part(points, cols, params, origin, layout, batch_bits, out, parts[c]);
  }
  for (const KeysPart& part : parts) {
    if (part.bad >= 0) {
      report_error(err, kStatusOutOfRange, part.bad);
      return kStatusOutOfRange;
    }
  }
  std::vector<PartPlace> places(num_parts);
  const auto [runs, rows] = merge_parts(parts, layout, out, places);
#pragma omp parallel for schedule(static) if (num_parts > 1)
  for (int c = 0; c < num_parts; ++c) {
    const PartPlace& place = places[c];
    const int32_t add = (int32_t)(first_run + place.run_zero);
    if (add != 0) {  // else a batch's first part: numbered from 0 already
      for (int64_t i = parts[c].begin; i < parts[c].end; ++i) {
        run_of_point[i] += run_of_point[i] >= 0 ? add : 0;  // branch-free: vectorized
      }
    }
    const int32_t add_row = (int32_t)(first_row + place.row_zero);
    if (add_row == 0) continue;
    for (int64_t r = place.run_begin; r < place.run_end; ++r) block_run[r] += add_row;
  }
  int64_t non_finite = 0, out_of_range = 0;
  for (const KeysPart& part : parts) {
    non_finite += part.non_finite;
    out_of_range += part.out_of_range;
  }
  counts[kNonFinite] = non_finite;
  counts[kOutOfRange] = out_of_range;
  counts[kRuns] = runs;
  counts[kBlockRows] = rows;
  return kStatusOk;
}
