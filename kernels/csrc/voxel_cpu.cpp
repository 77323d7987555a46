// The voxelizer's passes over the points around the keys pass (app/inference/voxelize.py): the
// validity of points (the rule the keys pass applies, for a caller that wants it first) and the
// voxels' feature sums once every run has its voxel. Host only, as voxel_keys_cpu.cpp. The sums
// pass splits the voxels among the threads and adds each voxel's points in point order, so the
// sums are the ones numpy's bincount makes, bit for bit.
//
// Without trapping math, as voxel_keys_cpu.cpp (the validity pass's comparisons vectorize).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>

#include "api.h"
#include "cpu_common.h"
#include "voxel_points.h"

using namespace lidarseg;
using namespace lidarseg::voxel;

namespace {

// counts[] of the validity pass: three tallies
enum Count { kNonFinite = 0, kOutOfRange = 1, kUncleanExtras = 2 };

// Whether a row's columns after x, y, z need cleaning: the intensity (column 3) outside
// 0 .. top or NaN, or a later column not finite (the route's clean_extra_columns then copies).
inline bool unclean_extras(const float* p, int64_t cols, float top) {
  bool bad = !((p[3] >= 0.0f) & (p[3] <= top));
  for (int64_t c = 4; c < cols; ++c) bad |= !std::isfinite(p[c]);
  return bad;
}

// valid_points' pass over points of kCols columns (0: `cols`), vectorized as the keys pass's
// chunk_keys (voxel_keys_cpu.cpp): rows of 3 or 4 columns in place, others through an XyzChunk.
template <int kCols>
void classify_points(const float* points, int64_t n, int64_t cols, const float* params,
                     uint8_t* keep, int64_t* counts) {
  int64_t not_finite = 0, outside = 0, unclean = 0;
  const float top = params[4];
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
      if (kCols == 4) unclean += !((p[3] >= 0.0f) & (p[3] <= top));
    }
  } else {
    XyzChunk xyz;
    for (int64_t begin = 0; begin < n; begin += kChunkRows) {
      const int64_t rows = std::min(kChunkRows, n - begin);
      xyz.copy(points + begin * cols, cols, rows);
      for (int64_t i = 0; i < rows; ++i) classify(xyz.x[i], xyz.y[i], xyz.z[i], keep + begin + i);
      if (cols > 3) {
        for (int64_t i = 0; i < rows; ++i)
          unclean += unclean_extras(points + (begin + i) * cols, cols, top);
      }
    }
  }
  counts[kNonFinite] = not_finite;
  counts[kOutOfRange] = outside;
  counts[kUncleanExtras] = unclean;
}

}  // namespace

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
              const int32_t* run_of_point, const int32_t* voxel_of_run, int64_t runs,
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
    // a count is at most n, an int32 (run_of_point's rows): through int32, the loop vectorises
    // on AVX2 too (it has no int64 -> double conversion)
    const double c = (double)(int32_t)std::max<int64_t>(counts[v], 1);
    for (int64_t j = 0; j < nf; ++j) means[v * nf + j] = (float)(sums[v * nf + j] / c);
  }
  return true;
}

}  // namespace

LS_API int ls_voxel_sums_cpu(const float* points, int64_t n, int64_t cols,
                             const int32_t* feature_cols, const float* feature_scales,
                             int64_t num_features, const int32_t* run_of_point,
                             const int32_t* voxel_of_run, int64_t runs, int64_t num_voxels,
                             int64_t clear, int64_t* voxel_of_point, double* sums,
                             int64_t* counts, float* means) {
  if (n < 0 || n > INT32_MAX || runs < 0 || num_features < 1 || num_features > Features<0>::kMax ||
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
  const int parts = parts_for(n);
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
