// The voxelizer's per-point passes (app/inference/voxelize.py): validity, cells, packed keys and
// runs in one pass, the voxels' feature sums in another. Host only, without a CUDA twin: the
// voxelizer runs on the host, where Open3D's hash set finds the occupied blocks of voxels
// (voxel_order_cpu.cpp orders what it finds). The keys pass runs in parts on several threads and
// gives what one pass in point order gives; the sums pass splits the voxels among the threads and
// adds each voxel's points in point order, so the sums are the ones numpy's bincount makes, bit
// for bit.
//
// The whole file without trapping math (before any include, so that <cmath>'s inline functions
// take it too): GCC then vectorizes the keys pass's float -> int conversions, which it keeps
// scalar while they may set FP exception flags (nothing here reads them; values are unchanged).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "api.h"
#include "cpu_common.h"
#include "voxel_keys.h"

using namespace lidarseg;
using namespace lidarseg::voxel;

namespace {

// counts[]: two tallies, the runs, then the lowest and the highest kept cell of each axis
enum Count { kNonFinite = 0, kOutOfRange = 1, kRuns = 2, kLow = 3, kHigh = 6 };

// The rule for a kept point: x, y, z finite (*finite), and |x|, |y| <= max_xy, z in [z_lo, z_hi]
// (*inside), compared in float32 (params: {voxel_size, max_xy, z_lo, z_hi}). Bitwise ands, no
// branch: the passes that call it vectorize.
struct PointRule {
  bool finite, inside;
  PointRule(float x, float y, float z, const float* params)
      : finite(std::isfinite(x) & std::isfinite(y) & std::isfinite(z)),
        inside((std::fabs(x) <= params[1]) & (std::fabs(y) <= params[1]) & (z >= params[2]) &
               (z <= params[3])) {}
  bool kept() const { return finite & inside; }
};

// Work (points, or points or voxels times features) below which one thread does a pass.
constexpr int64_t kParallelWork = 1 << 15;

// Points below which the sums pass runs on one thread: each of its threads reads every point,
// so a second one pays only on larger frames (nuScenes' 34,688 points: 0.22 ms on one thread,
// 0.28 on two; Ouster's 107,647: 0.91 and 0.60; the Intel Xeon).
constexpr int64_t kParallelSumPoints = 1 << 16;

// How many parts a pass of `work` items splits into: one per thread above kParallelWork.
inline int parts_for(int64_t work) {
  return work >= kParallelWork ? std::max(omp_get_max_threads(), 1) : 1;
}

// One contiguous part of the points in the keys pass: its runs are written from run_keys[begin]
// on and numbered from 0 in run_of_point; merged into one numbering afterwards.
struct KeysPart {
  int64_t begin = 0, end = 0, runs = 0, non_finite = 0, out_of_range = 0;
  int64_t first_key = -1, last_key = -1;
  int64_t low[3] = {kAxisCells, kAxisCells, kAxisCells}, high[3] = {-1, -1, -1};
  int64_t bad = -1;  // the first point outside the caller's grid
};

// A point's key in keys_of_part's first loop, or why it has none.
constexpr int64_t kKeyNotFinite = -1, kKeyOutside = -2, kKeyOffGrid = -3;

// floor(q) as an int64, clamped to +-1e9 (beyond any cell field); NaN gives -1e9. Comparisons
// and selects only, which the vectorizer turns into blends.
inline int64_t clamped_floor(float q) {
  constexpr float kFar = 1e9f;
  const float f = std::floor(q);
  const float high = f < kFar ? f : kFar;
  return (int64_t)(high > -kFar ? high : -kFar);
}

// f(std::integral_constant<int, C>{}) with C = cols for the sensors' layouts (x y z; x y z
// intensity; nuScenes' five columns), else C = 0: the passes below take C as a stride the
// compiler knows, which lets it vectorize their loads.
template <typename F>
void by_columns(int64_t cols, F&& f) {
  switch (cols) {
    case 3: f(std::integral_constant<int, 3>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 5: f(std::integral_constant<int, 5>{}); break;
    default: f(std::integral_constant<int, 0>{});
  }
}

// The key (or kKey* code) of a point at x, y, z: no branch, so the loops that call it vectorize
// (the divisions most of all).
inline int64_t point_key(float px, float py, float pz, const float* params, const int32_t* origin,
                         int64_t batch_bits) {
  const PointRule rule(px, py, pz, params);
  // floor(v / voxel) - origin (float32 division), the floor clamped first so that any point's
  // converts to int64 (a kept point's clamped cell is still off the grid, a kKeyOffGrid)
  const float voxel = params[0];
  const int64_t x = clamped_floor(px / voxel) - origin[0];
  const int64_t y = clamped_floor(py / voxel) - origin[1];
  const int64_t z = clamped_floor(pz / voxel) - origin[2];
  const bool on_grid = ((x | y | z) >= 0) & (((x | y | z) >> kAxisBits) == 0);
  const int64_t packed = batch_bits | x << (2 * kAxisBits) | y << kAxisBits | z;
  const int64_t why = rule.finite ? kKeyOutside : kKeyNotFinite;
  const int64_t kept_key = on_grid ? packed : kKeyOffGrid;
  return rule.kept() ? kept_key : why;
}

// Rows per chunk of the per-point passes (their stack buffers: 4 KB of keys, 6 KB of x, y, z).
constexpr int64_t kChunkRows = 512;

// x, y, z of up to kChunkRows rows of `cols` columns, side by side: GCC keeps a loop over rows
// of five columns (nuScenes) scalar, and vectorizes one over these arrays (the keys pass 8.8 ->
// 4.4 ns a point on one thread, the validity pass 3.8 -> 1.4).
struct XyzChunk {
  float x[kChunkRows], y[kChunkRows], z[kChunkRows];
  void copy(const float* p, int64_t cols, int64_t rows) {
    for (int64_t i = 0; i < rows; ++i, p += cols) x[i] = p[0], y[i] = p[1], z[i] = p[2];
  }
};

// The keys of points [begin, end) (at most kChunkRows) into key[0 .. end - begin). kCols 3 or
// 4: rows of that many columns, read in place (a stride the compiler knows: it vectorizes the
// loads). Other layouts are first copied into an XyzChunk.
template <int kCols>
void chunk_keys(const float* points, int64_t cols, const float* params, const int32_t* origin,
                int64_t batch_bits, int64_t begin, int64_t end, int64_t* key) {
  if (kCols == 3 || kCols == 4) {
    const float* p = points + begin * kCols;
    for (int64_t i = 0; i < end - begin; ++i, p += kCols) {
      key[i] = point_key(p[0], p[1], p[2], params, origin, batch_bits);
    }
    return;
  }
  XyzChunk xyz;
  xyz.copy(points + begin * cols, cols, end - begin);
  for (int64_t i = 0; i < end - begin; ++i) {
    key[i] = point_key(xyz.x[i], xyz.y[i], xyz.z[i], params, origin, batch_bits);
  }
}

void keys_of_part(const float* points, int64_t cols, const float* params, const int32_t* origin,
                  int64_t batch_bits, int64_t* run_keys, int64_t* run_of_point, KeysPart& part) {
  constexpr int64_t kChunk = kChunkRows;
  int64_t key[kChunk];
  int64_t* keys = run_keys + part.begin;
  int64_t runs = 0, last = -1, non_finite = 0, out_of_range = 0;
  int64_t low[3] = {kAxisCells, kAxisCells, kAxisCells}, high[3] = {-1, -1, -1};
  for (int64_t begin = part.begin; begin < part.end; begin += kChunk) {
    const int64_t end = std::min(begin + kChunk, part.end);
    by_columns(cols, [&](auto layout) {
      chunk_keys<decltype(layout)::value>(points, cols, params, origin, batch_bits, begin, end,
                                          key);
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
        run_of_point[i] = -1;
        continue;
      }
      // A scan often repeats a voxel, but not in a pattern a branch predicts (KITTI: 66,060
      // runs of 124,668 points): a new run is counted, its key stored and the bounds kept
      // without a branch (the store lands in the slot of the run in progress, at most point
      // i's own).
      runs += k != last;  // last is -1 before the first kept point
      keys[runs - 1] = k;
      for (int a = 0; a < 3; ++a) {
        low[a] = std::min(low[a], key_field(k, a + 1));
        high[a] = std::max(high[a], key_field(k, a + 1));
      }
      last = k;
      run_of_point[i] = runs - 1;
    }
  }
  part.first_key = runs > 0 ? keys[0] : -1;
  part.runs = runs;
  part.last_key = last;
  part.non_finite = non_finite;
  part.out_of_range = out_of_range;
  for (int a = 0; a < 3; ++a) part.low[a] = low[a], part.high[a] = high[a];
}

}  // namespace

LS_API int ls_voxel_keys_cpu(const float* points, int64_t n, int64_t cols, const float* params,
                             const int32_t* origin, int64_t batch, int64_t first_run,
                             int64_t* run_keys, int64_t* run_of_point, int64_t* counts,
                             int64_t* err) {
  if (n < 0 || cols < 3 || batch < 0 || batch >= (int64_t(1) << (63 - kBatchShift)) ||
      first_run < 0) {
    return kStatusBadArgument;
  }
  // Parts in parallel, then one numbering: a run that spans two parts is merged back into one,
  // so runs and keys are those of one pass in point order, whatever the thread count.
  const int num_parts = parts_for(n);
  std::vector<KeysPart> parts(num_parts);
  for (int c = 0; c < num_parts; ++c) {
    parts[c].begin = n * c / num_parts;
    parts[c].end = n * (c + 1) / num_parts;
  }
  const int64_t batch_bits = batch << kBatchShift;
#pragma omp parallel for schedule(static) if (num_parts > 1)
  for (int c = 0; c < num_parts; ++c) {
    keys_of_part(points, cols, params, origin, batch_bits, run_keys, run_of_point, parts[c]);
  }
  for (const KeysPart& part : parts) {
    if (part.bad >= 0) {
      report_error(err, kStatusOutOfRange, part.bad);
      return kStatusOutOfRange;
    }
  }
  std::vector<int64_t> shift(num_parts);  // the numbering's index of each part's run 0
  int64_t runs = 0, last = -1;
  for (int c = 0; c < num_parts; ++c) {
    const KeysPart& part = parts[c];
    if (part.runs == 0) continue;
    const int64_t merged = (runs > 0 && part.first_key == last) ? 1 : 0;
    shift[c] = runs - merged;
    std::memmove(run_keys + runs, run_keys + part.begin + merged,  // runs <= part.begin
                 sizeof(int64_t) * (part.runs - merged));
    runs += part.runs - merged;
    last = part.last_key;
  }
#pragma omp parallel for schedule(static) if (num_parts > 1)
  for (int c = 0; c < num_parts; ++c) {
    const int64_t add = first_run + shift[c];
    if (add == 0) continue;  // a batch's first part: numbered from 0 already
    for (int64_t i = parts[c].begin; i < parts[c].end; ++i) {
      run_of_point[i] += run_of_point[i] >= 0 ? add : 0;  // branch-free: vectorized
    }
  }
  int64_t low[3] = {kAxisCells, kAxisCells, kAxisCells}, high[3] = {-1, -1, -1};
  int64_t non_finite = 0, out_of_range = 0;
  for (const KeysPart& part : parts) {
    non_finite += part.non_finite;
    out_of_range += part.out_of_range;
    for (int a = 0; a < 3; ++a) {
      low[a] = std::min(low[a], part.low[a]);
      high[a] = std::max(high[a], part.high[a]);
    }
  }
  counts[kNonFinite] = non_finite;
  counts[kOutOfRange] = out_of_range;
  counts[kRuns] = runs;
  for (int a = 0; a < 3; ++a) {
    counts[kLow + a] = low[a];
    counts[kHigh + a] = high[a];
  }
  return kStatusOk;
}

// valid_points' pass over points of kCols columns (0: `cols`), vectorized as chunk_keys: rows
// of 3 or 4 columns in place, others through an XyzChunk.
template <int kCols>
void classify_points(const float* points, int64_t n, int64_t cols, const float* params,
                     uint8_t* keep, int64_t* counts) {
  int64_t not_finite = 0, outside = 0;
  const auto classify = [&](float x, float y, float z, uint8_t* kept) {
    const PointRule rule(x, y, z, params);
    *kept = rule.kept();
    not_finite += !rule.finite;
    outside += rule.finite & !rule.inside;
  };
  if (kCols == 3 || kCols == 4) {
    for (int64_t i = 0; i < n; ++i) {
      const float* p = points + i * kCols;
      classify(p[0], p[1], p[2], keep + i);
    }
  } else {
    XyzChunk xyz;
    for (int64_t begin = 0; begin < n; begin += kChunkRows) {
      const int64_t rows = std::min(kChunkRows, n - begin);
      xyz.copy(points + begin * cols, cols, rows);
      for (int64_t i = 0; i < rows; ++i) classify(xyz.x[i], xyz.y[i], xyz.z[i], keep + begin + i);
    }
  }
  counts[kNonFinite] = not_finite;
  counts[kOutOfRange] = outside;
}

LS_API int ls_valid_points_cpu(const float* points, int64_t n, int64_t cols, const float* params,
                               uint8_t* keep, int64_t* counts) {
  if (n < 0 || cols < 3) return kStatusBadArgument;
  // One thread, on purpose: the service calls this on its event loop thread while it decodes
  // a body, and a parallel region there would give the process a second OpenMP team. With more
  // threads in teams than CPUs, libgomp stops spinning at all (its throttled spin count, 0
  // under OMP_WAIT_POLICY=passive), and every one of the worker's 145 parallel regions a frame
  // pays a thread's wake-up again (server network stage 74 -> 80-84 ms, in-process unchanged).
  by_columns(cols, [&](auto layout) {
    classify_points<decltype(layout)::value>(points, n, cols, params, keep, counts);
  });
  return kStatusOk;
}

namespace {

// The features of one pass: column and float32 factor of each, a column < 0 (xyz-only input's
// intensity) read as column 0 times 0 (a kept point's x is finite: the same 0 the rule gives).
// kF > 0: that many features, known to the compiler (unrolled, each a plain load: with a run-time
// count GCC gathered them, and the sums pass waited on the gathers); 0: `count` at run time.
template <int kF>
struct Features {
  static constexpr int kMax = 8;
  int64_t col[kF > 0 ? kF : kMax];
  float scale[kF > 0 ? kF : kMax];
  int64_t count;
  bool in_place = true;  // feature j is column j
  Features(const int32_t* cols, const float* scales, int64_t num) : count(kF > 0 ? kF : num) {
    for (int64_t j = 0; j < count; ++j) {
      col[j] = std::max<int32_t>(cols[j], 0);
      scale[j] = cols[j] < 0 ? 0.0f : scales[j];
      in_place &= col[j] == j;
    }
  }
  // sums[j] += feature j of the point at p, in float64 (the float32 product widened once)
  void add(const float* p, double* sums) const {
    if (kF > 0 && in_place) {  // columns 0 .. kF - 1: one vector load, multiply and add
      for (int64_t j = 0; j < kF; ++j) sums[j] += (double)(p[j] * scale[j]);
      return;
    }
    for (int64_t j = 0; j < (kF > 0 ? kF : count); ++j) sums[j] += (double)(p[col[j]] * scale[j]);
  }
};

// One thread's share of the sums pass (ls_voxel_sums_cpu): the voxels [lo, hi) and the points
// [first_point, end_point); false at a bad run or voxel.
template <int kF>
bool sum_part(const float* points, int64_t n, int64_t cols, const Features<kF>& features,
              const int64_t* run_of_point, const int64_t* voxel_of_run, int64_t runs,
              int64_t num_voxels, bool clear, int64_t lo, int64_t hi, int64_t first_point,
              int64_t end_point, int64_t* voxel_of_point, double* sums, int64_t* counts,
              float* means) {
  const int64_t nf = features.count;
  if (clear) {
    std::fill(sums + lo * nf, sums + hi * nf, 0.0);
    std::fill(counts + lo, counts + hi, 0);
  }
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = run_of_point[i];
    const bool known = r >= -1 && r < runs;
    const int64_t v = r < 0 || !known ? -1 : voxel_of_run[r];  // -1: an ignored point
    if (!known || v >= num_voxels || (r >= 0 && v < 0)) return false;
    if (i >= first_point && i < end_point) voxel_of_point[i] = v;
    if (v < lo || v >= hi) continue;  // ignored points belong to no part
    features.add(points + i * cols, sums + v * nf);
    ++counts[v];
  }
  if (means == nullptr) return true;
  for (int64_t v = lo; v < hi; ++v) {  // numpy's float64 division, rounded once to float32
    const double c = (double)std::max<int64_t>(counts[v], 1);
    for (int64_t j = 0; j < nf; ++j) means[v * nf + j] = (float)(sums[v * nf + j] / c);
  }
  return true;
}

}  // namespace

LS_API int ls_voxel_sums_cpu(const float* points, int64_t n, int64_t cols,
                             const int32_t* feature_cols, const float* feature_scales,
                             int64_t num_features, const int64_t* run_of_point,
                             const int64_t* voxel_of_run, int64_t runs, int64_t num_voxels,
                             int64_t clear, int64_t* voxel_of_point, double* sums,
                             int64_t* counts, float* means) {
  if (n < 0 || runs < 0 || num_features < 1 || num_features > Features<0>::kMax ||
      num_voxels < 0) {
    return kStatusBadArgument;
  }
  for (int64_t j = 0; j < num_features; ++j) {
    if (feature_cols[j] >= cols) return kStatusBadArgument;
  }
  // Each thread owns a range of voxels and reads every point, adding those of its voxels: every
  // voxel's sum still runs in point order, so the sums are the same on any thread count. It
  // clears its voxels first and divides them last, in its own cache. It also owns a range of
  // points, whose voxels it writes (each thread finds every point's voxel itself: reading the
  // other's would move the lines between the cores). Runs and voxels are checked as they are
  // read (every thread reads them all); after a bad one the sums are left unfinished.
  const int parts = n >= kParallelSumPoints ? parts_for(n * num_features) : 1;
  const auto pass = [&](auto features, int part) {
    return sum_part(points, n, cols, features, run_of_point, voxel_of_run, runs, num_voxels,
                    clear != 0, num_voxels * part / parts, num_voxels * (part + 1) / parts,
                    n * part / parts, n * (part + 1) / parts, voxel_of_point, sums, counts,
                    means);
  };
  int bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad) if (parts > 1)
  for (int part = 0; part < parts; ++part) {
    bool ok;
    switch (num_features) {  // the default model's x, y, z, intensity; xyz-only models
      case 4: ok = pass(Features<4>(feature_cols, feature_scales, 4), part); break;
      case 3: ok = pass(Features<3>(feature_cols, feature_scales, 3), part); break;
      default: ok = pass(Features<0>(feature_cols, feature_scales, num_features), part);
    }
    bad |= !ok;
  }
  return bad ? kStatusBadArgument : kStatusOk;
}
