// CPU fused gather-GEMM-scatter ("fetch on demand"): for each kernel offset, tiles of map entries
// are multiplied by that offset's weight straight from the input rows (no gather buffer) and the
// tile is added into the output rows (no scatter buffer). Which thread computes which rows, and
// in which order, is fused_driver.h (shared with the bf16 twin, fused_bf16_cpu.cpp): every output
// row adds its contributions in a fixed order, bitwise reproducible for any thread count.
//
// The micro-kernel keeps a tile of kRows entries x (kVecs * kLanes) output channels in vector
// registers (GCC vector extensions: AVX-512, AVX2 or NEON, whatever -march gives), streams the
// weight rows, and broadcasts one input value per entry per input channel.
#include "api.h"
#include "fused_driver.h"

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

typedef float vfloat __attribute__((vector_size(kLanes * sizeof(float))));

inline vfloat load(const float* p) {
  vfloat v;
  __builtin_memcpy(&v, p, sizeof(v));
  return v;
}
inline void store(float* p, vfloat v) { __builtin_memcpy(p, &v, sizeof(v)); }

// One tile: rows in[0..rows) of x times w[:, col .. col + NV*kLanes), added into the out rows
// (or stored there when kStore: the first contribution of a row, so out needs no zeroing).
template <int NV, bool kStore>
void tile(const float* x, int64_t cin, const float* w, int64_t cout, int64_t col,
          const int32_t* in, const int32_t* out_rows, int rows, float* out,
          const lidarseg::StoreAddend& add) {
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
    const float* res = kStore && add.residual ? add.residual + out_rows[r] * cout + col : nullptr;
    for (int v = 0; v < NV; ++v) {
      vfloat value = kStore ? acc[r][v] : load(dst + v * kLanes) + acc[r][v];
      if (kStore && add.bias != nullptr) value += load(add.bias + col + v * kLanes);
      if (kStore && res != nullptr) value += load(res + v * kLanes);
      store(dst + v * kLanes, value);
    }
  }
}

// Entries [0, m) of one offset, all of whose outputs this thread owns, times that offset's weight.
template <bool kStore>
void entries_times_weight(const float* x, int64_t cin, const float* w, int64_t cout,
                          const int32_t* in, const int32_t* out_rows, int64_t m, float* out,
                          const lidarseg::StoreAddend& add) {
  for (int64_t first = 0; first < m; first += kRows) {
    const int rows = (int)((m - first) < kRows ? (m - first) : kRows);
    const int64_t next_end = first + 2 * kRows < m ? first + 2 * kRows : m;
    lidarseg::prefetch_entries(x, cin * (int64_t)sizeof(float), out, cout, in, out_rows,
                               first + kRows, next_end);
    for (int64_t col = 0; col < cout; col += kVecs * kLanes) {
      const int64_t vecs = (cout - col) / kLanes;
      const int32_t* i = in + first;
      const int32_t* o = out_rows + first;
      if (vecs >= 4) {
        tile<4, kStore>(x, cin, w, cout, col, i, o, rows, out, add);
      } else if (vecs == 3) {
        tile<3, kStore>(x, cin, w, cout, col, i, o, rows, out, add);
      } else if (vecs == 2) {
        tile<2, kStore>(x, cin, w, cout, col, i, o, rows, out, add);
      } else {
        tile<1, kStore>(x, cin, w, cout, col, i, o, rows, out, add);
      }
    }
  }
}

}  // namespace

LS_API int ls_fused_lanes_cpu(void) { return kLanes; }

LS_API int ls_fused_conv_f32_cpu(const float* x, int64_t cin, const float* w, int64_t cout,
                                 const int32_t* in_idx, const int32_t* out_idx,
                                 const int64_t* bounds, const int32_t* kernel_order,
                                 int64_t num_kernels, int32_t identity, const float* bias,
                                 const float* residual, int32_t relu, int64_t num_out,
                                 float* out) {
  if (cout % kLanes != 0 || cin <= 0 || num_out < 0) return lidarseg::kStatusBadArgument;
  lidarseg::run_fused(
      w, cin * cout, cin, cout, in_idx, out_idx, bounds, kernel_order, num_kernels, identity, bias,
      residual, relu, num_out, out,
      [=](bool store, const float* w_k, const int32_t* in, const int32_t* rows, int64_t m,
          float* dst, const lidarseg::StoreAddend& add) {
        if (store) {
          entries_times_weight<true>(x, cin, w_k, cout, in, rows, m, dst, add);
        } else {
          entries_times_weight<false>(x, cin, w_k, cout, in, rows, m, dst, add);
        }
      });
  return lidarseg::kStatusOk;
}
