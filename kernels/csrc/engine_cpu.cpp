// CPU twin of cuda/engine_cuda.cu: the gather and scatter halves of gather-matmul-scatter. The
// matmuls themselves run in torch (MKL / oneDNN). No atomics: the scatter walks each output row's
// contributions in a fixed order, so results are bitwise reproducible for any thread count.
#include <omp.h>

#include <cmath>
#include <cstring>

#include "api.h"

namespace {

constexpr int64_t kParallelWork = 1 << 16;  // floats moved below which one thread is faster

template <typename T>
int gather_rows(const T* src, int64_t n, int64_t c, const int32_t* idx, int64_t m, T* dst) {
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
#pragma omp parallel for schedule(static) if (n_out * c >= kParallelWork)
  for (int64_t o = 0; o < n_out; ++o) {
    const int64_t begin = ptr[o], end = ptr[o + 1];
    if (begin == end) continue;
    T* out = dst + o * c;
    for (int64_t j = begin; j < end; ++j) {
      const int64_t r = rows[j];
      if (r < row_lo) continue;
      if (r >= row_hi) break;  // each output's rows ascend
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

// The class of each row (the first largest value; the first NaN where a row has one, as
// torch.argmax), as one byte: the pipeline's per-voxel labels.
LS_API int ls_argmax_rows_u8_cpu(const float* x, int64_t n, int64_t c, uint8_t* out) {
  if (n < 0 || c < 1 || c > 256) return lidarseg::kStatusBadArgument;
#pragma omp parallel for schedule(static) if (n * c >= kParallelWork)
  for (int64_t r = 0; r < n; ++r) {
    const float* row = x + r * c;
    float most = row[0];
    bool nan = false;
    for (int64_t j = 0; j < c; ++j) {  // branch-free: the row's largest value, and any NaN
      most = row[j] > most ? row[j] : most;
      nan |= std::isnan(row[j]);
    }
    int64_t best = 0;
    while (nan ? !std::isnan(row[best]) : row[best] != most) ++best;  // its first place
    out[r] = (uint8_t)best;
  }
  return lidarseg::kStatusOk;
}
