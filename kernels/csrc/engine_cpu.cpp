// CPU twin of cuda/engine_cuda.cu: the gather and scatter halves of gather-matmul-scatter. The
// matmuls themselves run in torch (MKL / oneDNN). No atomics: the scatter walks each output row's
// contributions in a fixed order, so results are bitwise reproducible for any thread count.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "api.h"
#include "head.h"

#if defined(__x86_64__)
// GCC 12's AVX-512 reductions trip -Wuninitialized inside its own header under target
// attributes (GCC bug 105593; see fused_int8_cpu.cpp).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#define LS_HEAD_AVX512 1
#else
#define LS_HEAD_AVX512 0
#endif

namespace {

constexpr int64_t kParallelWork = 1 << 16;  // floats moved below which one thread is faster

template <typename T>
int gather_rows(const T* src, int64_t n, int64_t c, const int32_t* idx, int64_t m, T* dst) {
  if (const int status = lidarseg::gather_args(n, c, m); status != lidarseg::kStatusOk) {
    return status;
  }
  if (!lidarseg::rows_to_do(m, c)) return lidarseg::kStatusOk;
#pragma omp parallel for schedule(static) if (m * c >= kParallelWork)
  for (int64_t i = 0; i < m; ++i) {
    const int32_t j = idx[i];
    T* out = dst + i * c;
    if (j >= 0 && j < n) {
      std::memcpy(out, src + (int64_t)j * c, sizeof(T) * c);
    } else {
      std::memset(out, 0, sizeof(T) * c);
    }
  }
  return lidarseg::kStatusOk;
}

template <typename T>
int scatter_add_csr(const T* src, int64_t c, const int64_t* ptr, const int32_t* rows,
                    int64_t n_out, int64_t row_lo, int64_t row_hi, T* dst) {
  const int status = lidarseg::scatter_csr_args(c, n_out, row_lo, row_hi);
  if (status != lidarseg::kStatusOk) return status;
  if (!lidarseg::rows_to_do(n_out, c) || row_hi == row_lo) return lidarseg::kStatusOk;
#pragma omp parallel for schedule(static) if (n_out * c >= kParallelWork)
  for (int64_t o = 0; o < n_out; ++o) {
    const int64_t begin = ptr[o], end = ptr[o + 1];
    if (begin == end) continue;
    T* out = dst + o * c;
    // each output's rows ascend: its first in [row_lo, row_hi) found by bisection (a scatter
    // split into many row ranges walked every output's list from its start, once per range)
    for (int64_t j = lidarseg::lower_bound(rows, begin, end, row_lo); j < end; ++j) {
      const int64_t r = rows[j];
      if (r >= row_hi) break;
      const T* in = src + (r - row_lo) * c;
#pragma omp simd
      for (int64_t x = 0; x < c; ++x) out[x] += in[x];
    }
  }
  return lidarseg::kStatusOk;
}

template <typename T>
int scatter_add_unique(const T* src, int64_t m, int64_t c, const int32_t* idx, T* dst) {
#pragma omp parallel for schedule(static) if (m * c >= kParallelWork)
  for (int64_t i = 0; i < m; ++i) {
    const int32_t o = idx[i];
    if (o < 0) continue;
    T* out = dst + (int64_t)o * c;
    const T* in = src + i * c;
#pragma omp simd
    for (int64_t x = 0; x < c; ++x) out[x] += in[x];
  }
  return lidarseg::kStatusOk;
}

}  // namespace

LS_API int ls_gather_rows_f32_cpu(const float* src, int64_t n, int64_t c, const int32_t* idx,
                                  int64_t m, float* dst) {
  return gather_rows(src, n, c, idx, m, dst);
}
LS_API int ls_gather_rows_f64_cpu(const double* src, int64_t n, int64_t c, const int32_t* idx,
                                  int64_t m, double* dst) {
  return gather_rows(src, n, c, idx, m, dst);
}
LS_API int ls_scatter_add_csr_f32_cpu(const float* src, int64_t c, const int64_t* ptr,
                                      const int32_t* rows, int64_t n_out, int64_t row_lo,
                                      int64_t row_hi, float* dst) {
  return scatter_add_csr(src, c, ptr, rows, n_out, row_lo, row_hi, dst);
}
LS_API int ls_scatter_add_csr_f64_cpu(const double* src, int64_t c, const int64_t* ptr,
                                      const int32_t* rows, int64_t n_out, int64_t row_lo,
                                      int64_t row_hi, double* dst) {
  return scatter_add_csr(src, c, ptr, rows, n_out, row_lo, row_hi, dst);
}
LS_API int ls_scatter_add_unique_f32_cpu(const float* src, int64_t m, int64_t c,
                                         const int32_t* idx, float* dst) {
  return scatter_add_unique(src, m, c, idx, dst);
}
LS_API int ls_scatter_add_unique_f64_cpu(const double* src, int64_t m, int64_t c,
                                         const int32_t* idx, double* dst) {
  return scatter_add_unique(src, m, c, idx, dst);
}

// The first largest of v[0..c) (the first NaN where there is one), as torch.argmax picks. Four
// running maxima (no chain of c dependent compares), then the first place of the largest.
inline int64_t first_largest(const float* v, int64_t c) {
  float m[4] = {v[0], v[0], v[0], v[0]};
  bool nan = false;
  int64_t j = 0;
  for (; j + 4 <= c; j += 4) {
    for (int k = 0; k < 4; ++k) {
      m[k] = v[j + k] > m[k] ? v[j + k] : m[k];
      nan |= std::isnan(v[j + k]);
    }
  }
  for (; j < c; ++j) {
    m[0] = v[j] > m[0] ? v[j] : m[0];
    nan |= std::isnan(v[j]);
  }
  const float a = m[0] > m[1] ? m[0] : m[1], b = m[2] > m[3] ? m[2] : m[3];
  const float most = a > b ? a : b;
  int64_t best = 0;
  while (nan ? !std::isnan(v[best]) : v[best] != most) ++best;
  return best;
}

// The class of each row (the first largest value; the first NaN where a row has one, as
// torch.argmax), as one byte: the pipeline's per-voxel labels.
LS_API int ls_argmax_rows_u8_cpu(const float* x, int64_t n, int64_t c, uint8_t* out) {
  if (n < 0 || c < 1 || c > 256) return lidarseg::kStatusBadArgument;
#pragma omp parallel for schedule(static) if (n * c >= kParallelWork)
  for (int64_t r = 0; r < n; ++r) out[r] = (uint8_t)first_largest(x + r * c, c);
  return lidarseg::kStatusOk;
}

// Rows first .. first + kHeadTile of x times w_t plus bias, into logits [kHeadTile][32].
constexpr int kHeadTile = 8;

namespace {

#if LS_HEAD_AVX512
// first_largest of `rows` logits rows [32] (classes 0..c), out[r] its class: the two halves of
// a row as vectors, one max reduction, the first lane equal to it (the first NaN lane where the
// row has one). No branch on the values, where the scalar scan mispredicts once a row.
__attribute__((target("avx512f"))) void tile_classes_avx512(const float (*logits)[32],
                                                            int64_t rows, int64_t c,
                                                            uint8_t* out) {
  const uint32_t lanes = c >= 32 ? 0xFFFFFFFFu : (1u << c) - 1;  // classes 0..c of the 32
  const __mmask16 lo = (__mmask16)(lanes & 0xFFFF), hi = (__mmask16)(lanes >> 16);
  const __m512 low = _mm512_set1_ps(-INFINITY);
  for (int64_t r = 0; r < rows; ++r) {
    const __m512 a = _mm512_mask_loadu_ps(low, lo, logits[r]);
    const __m512 b = _mm512_mask_loadu_ps(low, hi, logits[r] + 16);
    const unsigned nan = (unsigned)_mm512_mask_cmp_ps_mask(lo, a, a, _CMP_UNORD_Q) |
                         (unsigned)_mm512_mask_cmp_ps_mask(hi, b, b, _CMP_UNORD_Q) << 16;
    const __m512 most = _mm512_set1_ps(_mm512_reduce_max_ps(_mm512_max_ps(a, b)));
    const unsigned top = (unsigned)_mm512_mask_cmp_ps_mask(lo, a, most, _CMP_EQ_OQ) |
                         (unsigned)_mm512_mask_cmp_ps_mask(hi, b, most, _CMP_EQ_OQ) << 16;
    out[r] = (uint8_t)__builtin_ctz(nan ? nan : top);
  }
}

bool head_avx512() {
  static const bool has = __builtin_cpu_supports("avx512f");
  return has;
}
#endif

// out[r] = first_largest(logits[r], c) for the rows of one tile.
void tile_classes(const float (*logits)[32], int64_t rows, int64_t c, uint8_t* out) {
#if LS_HEAD_AVX512
  if (head_avx512()) return tile_classes_avx512(logits, rows, c, out);
#endif
  for (int64_t r = 0; r < rows; ++r) out[r] = (uint8_t)first_largest(logits[r], c);
}

}  // namespace
// Columns of a head tile per vector, and rows computed at once: the rows' accumulators (up to
// 32 / kHeadVec each) and one row of weights stay in the vector registers (32 with AVX-512, 16
// with AVX2, where 8 rows of 32 columns had spilled: the head took 7 % of the int8 network on the
// AMD EPYC Zen 1, perf, 2026-12-04). Each logit is the same operations in the same order either
// way: the bias, then each input channel's product added.
#if defined(__AVX512F__)
constexpr int kHeadVec = 16;
constexpr int kHeadRowsAtOnce = 8;
#else
constexpr int kHeadVec = 8;
constexpr int kHeadRowsAtOnce = 2;
#endif

// Rows [0, kHeadTile) of x times w_t plus bias, columns [0, NV * kHeadVec), into logits.
template <int NV>
void head_tile(const float* x, int64_t cin, const float* w_t, const float* bias,
               float (*logits)[32]) {
  typedef float vec __attribute__((vector_size(kHeadVec * sizeof(float))));
  for (int first = 0; first < kHeadTile; first += kHeadRowsAtOnce) {
    vec acc[kHeadRowsAtOnce][NV];
    for (int v = 0; v < NV; ++v) {
      vec b;
      std::memcpy(&b, bias + v * kHeadVec, sizeof(vec));
      for (int r = 0; r < kHeadRowsAtOnce; ++r) acc[r][v] = b;
    }
    const float* rows = x + first * cin;
    for (int64_t c = 0; c < cin; ++c) {
      vec w[NV];
      for (int v = 0; v < NV; ++v) std::memcpy(&w[v], w_t + c * 32 + v * kHeadVec, sizeof(vec));
      for (int r = 0; r < kHeadRowsAtOnce; ++r) {
        const float value = rows[r * cin + c];
        for (int v = 0; v < NV; ++v) acc[r][v] += value * w[v];
      }
    }
    for (int r = 0; r < kHeadRowsAtOnce; ++r) {
      for (int v = 0; v < NV; ++v) {
        std::memcpy(logits[first + r] + v * kHeadVec, &acc[r][v], sizeof(vec));
      }
    }
  }
}

// head_tile for the columns that hold cout classes (the logits beyond them are not written).
inline void head_tile(const float* x, int64_t cin, const float* w_t, const float* bias,
                      int64_t cout, float (*logits)[32]) {
  static_assert(kHeadTile % kHeadRowsAtOnce == 0, "a head tile is whole groups of rows");
  switch ((cout + kHeadVec - 1) / kHeadVec) {
    case 1:
      return head_tile<1>(x, cin, w_t, bias, logits);
#if !defined(__AVX512F__)
    case 2:
      return head_tile<2>(x, cin, w_t, bias, logits);
    case 3:
      return head_tile<3>(x, cin, w_t, bias, logits);
#endif
    default:
      return head_tile<32 / kHeadVec>(x, cin, w_t, bias, logits);
  }
}

// The pipeline's head and argmax in one pass: for each row of x [n, cin], the class with the
// largest x . w[o] + bias[o] (w_t [cin, 32]: nn.Linear's weight transposed, zero beyond cout;
// bias [32]), picked as first_largest picks; cout in 1..32. Rows in tiles of 8, computed
// kHeadRowsAtOnce at a time so that enough accumulators hide the FMA latency without spilling;
// the logits stay in a tile's buffer.
// Rows [0, n) of x [n, cin] in tiles of kHeadTile (the last padded with zero rows); each row's
// class depends on that row alone, so any split of the rows gives the same classes.
void lidarseg::head_classes(const float* x, int64_t n, int64_t cin, const float* w_t,
                            const float* bias, int64_t cout, uint8_t* out) {
  for (int64_t first = 0; first < n; first += kHeadTile) {
    const int64_t rows = std::min<int64_t>(kHeadTile, n - first);
    float logits[kHeadTile][32];
    if (rows == kHeadTile) {
      head_tile(x + first * cin, cin, w_t, bias, cout, logits);
    } else {  // the last rows, padded with zero rows
      std::vector<float> tail(kHeadTile * cin, 0.0f);
      std::memcpy(tail.data(), x + first * cin, sizeof(float) * rows * cin);
      head_tile(tail.data(), cin, w_t, bias, cout, logits);
    }
    tile_classes(logits, rows, cout, out + first);
  }
}

LS_API int ls_linear_argmax_u8_cpu(const float* x, int64_t n, int64_t cin, const float* w_t,
                                   const float* bias, int64_t cout, uint8_t* out) {
  if (n < 0 || cin < 1 || cout < 1 || cout > 32) return lidarseg::kStatusBadArgument;
  const int64_t tiles = (n + kHeadTile - 1) / kHeadTile;
#pragma omp parallel for schedule(static) if (n * cin * cout >= kParallelWork * 16)
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t first = t * kHeadTile;
    lidarseg::head_classes(x + first * cin, std::min<int64_t>(kHeadTile, n - first), cin, w_t,
                           bias, cout, out + first);
  }
  return lidarseg::kStatusOk;
}
