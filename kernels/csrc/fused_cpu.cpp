// CPU fused gather-GEMM-scatter ("fetch on demand"): for each kernel offset, tiles of map entries
// are multiplied by that offset's weight straight from the input rows (no gather buffer) and the
// tile is added into the output rows (no scatter buffer). Within one offset the output rows are
// distinct, so tiles run in parallel without atomics; offsets run one after another in the order
// given, so every output row adds its contributions in a fixed order: bitwise reproducible for
// any thread count.
//
// The micro-kernel keeps a tile of kRows entries x (kVecs * kLanes) output channels in vector
// registers (GCC vector extensions: AVX-512, AVX2 or NEON, whatever -march gives), streams the
// weight rows, and broadcasts one input value per entry per input channel.
#include <omp.h>

#include "api.h"

namespace {

#if defined(__AVX512F__)
constexpr int kLanes = 16;
constexpr int kRows = 6;
#elif defined(__AVX__)
constexpr int kLanes = 8;
constexpr int kRows = 3;
#else
constexpr int kLanes = 4;
constexpr int kRows = 4;
#endif
constexpr int kVecs = 4;  // up to 4 vectors of output channels per tile
constexpr int64_t kParallelWork = 1 << 18;  // multiply-adds below which one thread is faster

typedef float vfloat __attribute__((vector_size(kLanes * sizeof(float))));

inline vfloat load(const float* p) {
  vfloat v;
  __builtin_memcpy(&v, p, sizeof(v));
  return v;
}
inline void store(float* p, vfloat v) { __builtin_memcpy(p, &v, sizeof(v)); }

// One tile: rows in[0..rows) of x times w[:, col .. col + NV*kLanes), added into out rows.
template <int NV>
void tile(const float* x, int64_t cin, const float* w, int64_t cout, int64_t col,
          const int32_t* in, const int32_t* out_rows, int rows, float* out) {
  vfloat acc[kRows][NV];
  for (int r = 0; r < kRows; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = vfloat{} ;
  const float* src[kRows];
  for (int r = 0; r < kRows; ++r) src[r] = x + (int64_t)in[r < rows ? r : 0] * cin;
  for (int64_t ci = 0; ci < cin; ++ci) {
    vfloat wv[NV];
    for (int v = 0; v < NV; ++v) wv[v] = load(w + ci * cout + col + v * kLanes);
    for (int r = 0; r < kRows; ++r) {
      const float s = src[r][ci];
      for (int v = 0; v < NV; ++v) acc[r][v] += s * wv[v];
    }
  }
  for (int r = 0; r < rows; ++r) {
    float* dst = out + (int64_t)out_rows[r] * cout + col;
    for (int v = 0; v < NV; ++v) store(dst + v * kLanes, load(dst + v * kLanes) + acc[r][v]);
  }
}

void entries_times_weight(const float* x, int64_t cin, const float* w, int64_t cout,
                          const int32_t* in, const int32_t* out_rows, int64_t m, float* out) {
  const int64_t tiles = (m + kRows - 1) / kRows;
  // Small maps (deep levels) run on one thread: a parallel region costs more than they do.
#pragma omp parallel for schedule(static) if (m * cin * cout >= kParallelWork)
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t first = t * kRows;
    const int rows = (int)((m - first) < kRows ? (m - first) : kRows);
    // The rows are scattered over the feature matrix: ask for the next tile's input and output
    // rows now so their cache misses overlap this tile's arithmetic.
    for (int64_t e = first + kRows; e < first + 2 * kRows && e < m; ++e) {
      const char* src_row = (const char*)(x + (int64_t)in[e] * cin);
      const char* dst_row = (const char*)(out + (int64_t)out_rows[e] * cout);
      for (int64_t b = 0; b < cin * (int64_t)sizeof(float); b += 64) __builtin_prefetch(src_row + b);
      for (int64_t b = 0; b < cout * (int64_t)sizeof(float); b += 64) __builtin_prefetch(dst_row + b, 1);
    }
    for (int64_t col = 0; col < cout; col += kVecs * kLanes) {
      const int64_t vecs = (cout - col) / kLanes;
      const int32_t* i = in + first;
      const int32_t* o = out_rows + first;
      if (vecs >= 4) {
        tile<4>(x, cin, w, cout, col, i, o, rows, out);
      } else if (vecs == 3) {
        tile<3>(x, cin, w, cout, col, i, o, rows, out);
      } else if (vecs == 2) {
        tile<2>(x, cin, w, cout, col, i, o, rows, out);
      } else {
        tile<1>(x, cin, w, cout, col, i, o, rows, out);
      }
    }
  }
}

}  // namespace

LS_API int ls_fused_lanes_cpu(void) { return kLanes; }

LS_API int ls_fused_conv_f32_cpu(const float* x, int64_t cin, const float* w, int64_t cout,
                                 const int32_t* in_idx, const int32_t* out_idx,
                                 const int64_t* bounds, const int32_t* kernel_order,
                                 int64_t num_kernels, float* out) {
  if (cout % kLanes != 0 || cin <= 0) return lidarseg::kStatusBadArgument;
  for (int64_t j = 0; j < num_kernels; ++j) {
    const int32_t k = kernel_order[j];
    const int64_t lo = bounds[k], hi = bounds[k + 1];
    if (hi > lo) {
      entries_times_weight(x, cin, w + (int64_t)k * cin * cout, cout, in_idx + lo, out_idx + lo,
                           hi - lo, out);
    }
  }
  return lidarseg::kStatusOk;
}
