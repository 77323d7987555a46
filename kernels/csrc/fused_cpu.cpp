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

#include <vector>

#include "api.h"
#include "cpu_common.h"

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
constexpr int64_t kBlockBytes = 256 << 10;  // output rows per block: this many bytes of them

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
    for (int v = 0; v < NV; ++v) {
      store(dst + v * kLanes, kStore ? acc[r][v] : load(dst + v * kLanes) + acc[r][v]);
    }
  }
}

// Entries [0, m) of one offset, all of whose outputs this thread owns, times that offset's weight.
template <bool kStore>
void entries_times_weight(const float* x, int64_t cin, const float* w, int64_t cout,
                          const int32_t* in, const int32_t* out_rows, int64_t m, float* out) {
  for (int64_t first = 0; first < m; first += kRows) {
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
        tile<4, kStore>(x, cin, w, cout, col, i, o, rows, out);
      } else if (vecs == 3) {
        tile<3, kStore>(x, cin, w, cout, col, i, o, rows, out);
      } else if (vecs == 2) {
        tile<2, kStore>(x, cin, w, cout, col, i, o, rows, out);
      } else {
        tile<1, kStore>(x, cin, w, cout, col, i, o, rows, out);
      }
    }
  }
}

// Rows [0, n) of out (cout wide) += bias and += the same rows of residual (each when given),
// then max(0, .) when relu: done per block while its rows are still in L2, instead of more
// passes over the whole output.
void epilogue(const float* bias, const float* residual, bool relu, int64_t cout, float* out,
              int64_t n) {
  for (int64_t r = 0; r < n; ++r) {
    float* row = out + r * cout;
    for (int64_t c = 0; c < cout; c += kLanes) {
      vfloat v = load(row + c);
      if (bias != nullptr) v += load(bias + c);
      if (residual != nullptr) v += load(residual + r * cout + c);
      if (relu) v = v > 0 ? v : vfloat{};
      store(row + c, v);
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
  int64_t entries = identity >= 0 ? num_out : 0;
  for (int64_t j = 0; j < num_kernels; ++j) {
    const int32_t k = kernel_order[j];
    entries += bounds[k + 1] - bounds[k];
  }
  // Each thread owns a contiguous range of output rows and walks every offset's entries for that
  // range (entries are sorted by output within an offset). No two threads touch the same output
  // row, so there is no barrier between offsets, and each row adds its offsets in kernel_order
  // (after the identity offset, which stores rather than adds, when there is one).
  //
  // The range is walked in blocks of output rows that stay in L2 (kBlockBytes), every offset in
  // turn per block: a row is then read and written back from L2 by all its offsets instead of
  // once per offset pass over the whole range, and on sorted coordinates the inputs of a block
  // are a band of nearby rows as well.
  const int64_t fit = kBlockBytes / (cout * (int64_t)sizeof(float));
  const int64_t block_rows = fit > 16 ? fit : 16;
#pragma omp parallel if (entries * cin * cout >= kParallelWork)
  {
    const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t lo = num_out * t / threads, hi = num_out * (t + 1) / threads;
    std::vector<int64_t> cursor(num_kernels);
    for (int64_t j = 0; j < num_kernels; ++j) {
      const int32_t k = kernel_order[j];
      cursor[j] = lidarseg::lower_bound(out_idx, bounds[k], bounds[k + 1], lo);
    }
    std::vector<int32_t> rows(block_rows);
    for (int64_t block = lo; block < hi; block += block_rows) {
      const int64_t end = block + block_rows < hi ? block + block_rows : hi;
      if (identity >= 0) {  // in = out = every row of the block
        for (int64_t r = block; r < end; ++r) rows[r - block] = (int32_t)r;
        entries_times_weight<true>(x, cin, w + (int64_t)identity * cin * cout, cout, rows.data(),
                                   rows.data(), end - block, out);
      }
      for (int64_t j = 0; j < num_kernels; ++j) {
        const int32_t k = kernel_order[j];
        const int64_t first = cursor[j];
        const int64_t last = lidarseg::lower_bound(out_idx, first, bounds[k + 1], end);
        cursor[j] = last;
        if (last > first) {
          entries_times_weight<false>(x, cin, w + (int64_t)k * cin * cout, cout, in_idx + first,
                                      out_idx + first, last - first, out);
        }
      }
      if (bias != nullptr || residual != nullptr || relu) {
        epilogue(bias, residual == nullptr ? nullptr : residual + block * cout, relu != 0, cout,
                 out + block * cout, end - block);
      }
    }
  }
  return lidarseg::kStatusOk;
}
