// The voxelizer's per-point passes over raw points, shared by their files (voxel_keys_cpu.cpp:
// the keys pass; voxel_cpu.cpp: the validity and sums passes): the rule for a kept point, the
// column layouts the compiler knows, and when a pass takes more than one thread. Host only.
#pragma once
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

namespace lidarseg {
namespace voxel {

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

// Points below which the keys and sums passes run on one thread: a second one pays only on
// larger frames (the Intel Xeon: the sums pass, each of whose threads reads every point, on
// nuScenes' 34,688 points 0.22 ms on one thread, 0.28 on two, on Ouster's 107,647 0.91 and
// 0.60; the keys pass, caches taken by other work first, 0.19 and 0.29 on nuScenes, 0.47 and
// 0.35 on Ouster, 0.53 and 0.39 on KITTI's 124,668).
constexpr int64_t kParallelPassPoints = 1 << 16;

// How many parts a pass over n points splits into: one per thread from kParallelPassPoints on.
inline int parts_for(int64_t n) {
  return n >= kParallelPassPoints ? std::max(omp_get_max_threads(), 1) : 1;
}

// f(std::integral_constant<int, C>{}) with C = cols for the sensors' layouts (x y z; x y z
// intensity; nuScenes' five columns), else C = 0: the passes take C as a stride the
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

}  // namespace voxel
}  // namespace lidarseg
