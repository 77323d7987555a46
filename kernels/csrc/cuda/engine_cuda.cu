// CUDA twin of engine_cpu.cpp: the gather and scatter halves of gather-matmul-scatter (the
// matmuls run in torch / cuBLAS). Row-wise kernels: threadIdx.x walks the channels of a row,
// threadIdx.y and blockIdx.x walk the rows (grid-stride, see launch.h).
//
// The CSR scatter is deterministic: each output element is owned by one thread, which starts from
// dst, adds the contributions in ptr order and writes once. For f32 and f64 that is the same
// sequence of additions as the CPU twin, so the results match it bit for bit; fp16 sums into an
// fp32 copy of the output, like the atomic scatter. The atomic scatter
// is faster for scattered writes but its summation order varies from run to run.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "api_cuda.h"
#include "launch.h"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 600
#error "atomicAdd on double needs sm_60 or newer"
#endif

using namespace lidarseg;

// Kernels live in lidarseg::(anonymous), so every one of ours has "lidarseg" in its name (the
// GPU check's compute-sanitizer run filters on it).
namespace lidarseg {
namespace {

// ---- gather: a bit-exact row copy, so it works on raw words of the widest size that the row
// length and both pointers allow (16 bytes for most channel counts). Type-independent: f16 rows
// are copied as their bits, which is exactly what a __half copy would do.

template <typename W>
__global__ void gather_words_kernel(const W* src, int64_t n, int64_t words, const int32_t* idx,
                                    int64_t m, W* dst) {
  const int64_t row_step = (int64_t)gridDim.x * blockDim.y;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.y + threadIdx.y; i < m; i += row_step) {
    const int32_t j = idx[i];
    W* out = dst + i * words;
    if (j >= 0 && j < n) {
      const W* in = src + (int64_t)j * words;
      for (int64_t x = threadIdx.x; x < words; x += blockDim.x) out[x] = in[x];
    } else {
      for (int64_t x = threadIdx.x; x < words; x += blockDim.x) out[x] = W();  // all-zero bits
    }
  }
}

template <typename W>
int launch_gather(const void* src, int64_t n, int64_t row_bytes, const int32_t* idx, int64_t m,
                  void* dst, cudaStream_t s) {
  const int64_t words = row_bytes / (int64_t)sizeof(W);
  const cuda::RowLaunch l = cuda::row_launch(m, words);
  gather_words_kernel<W><<<l.grid, l.block, 0, s>>>(static_cast<const W*>(src), n, words, idx, m,
                                                    static_cast<W*>(dst));
  return cuda::launch_status();
}

// dst[i] = src[idx[i]], a zero row where idx[i] < 0 or idx[i] >= n (as on the CPU).
int gather_rows(const void* src, int64_t n, int64_t c, int64_t elem_bytes, const int32_t* idx,
                int64_t m, void* dst, void* stream) {
  if (const int status = gather_args(n, c, m); status != kStatusOk) return status;
  if (!rows_to_do(m, c)) return kStatusOk;
  const cudaStream_t s = cuda::as_stream(stream);
  const int64_t row_bytes = c * elem_bytes;
  const uint64_t align = (uint64_t)(uintptr_t)src | (uint64_t)(uintptr_t)dst | (uint64_t)row_bytes;
  if (align % 16 == 0) return launch_gather<uint4>(src, n, row_bytes, idx, m, dst, s);
  if (align % 8 == 0) return launch_gather<uint2>(src, n, row_bytes, idx, m, dst, s);
  if (align % 4 == 0) return launch_gather<uint32_t>(src, n, row_bytes, idx, m, dst, s);
  return launch_gather<uint16_t>(src, n, row_bytes, idx, m, dst, s);  // every type is >= 2 bytes
}

// ---- accumulation: f32 and f16 sources add in float, f64 in double.

template <typename T>
struct Acc;
template <>
struct Acc<float> {
  using type = float;
  __device__ static float load(float v) { return v; }
};
template <>
struct Acc<double> {
  using type = double;
  __device__ static double load(double v) { return v; }
};
template <>
struct Acc<__half> {
  using type = float;
  __device__ static float load(__half v) { return __half2float(v); }
};

// dst[o] += sum of src[rows[j] - row_lo] for the j in [ptr[o], ptr[o + 1]) with rows[j] in
// [row_lo, row_hi), in that order (each output's rows ascend). The accumulator starts at dst[o], so
// the additions happen in the CPU twin's order, and a scatter split into row ranges makes the
// same additions as one call. D is the accumulator and dst type: T for f32 and f64, float for f16
// (rounded once, by the caller's copy into the fp16 output).
template <typename T, typename D>
__global__ void scatter_csr_kernel(const T* src, int64_t c, const int64_t* ptr,
                                   const int32_t* rows, int64_t n_out, int64_t row_lo,
                                   int64_t row_hi, D* dst) {
  const int64_t row_step = (int64_t)gridDim.x * blockDim.y;
  for (int64_t o = (int64_t)blockIdx.x * blockDim.y + threadIdx.y; o < n_out; o += row_step) {
    const int64_t end = ptr[o + 1];
    // the output's first row in [row_lo, row_hi), by bisection: a scatter split into many row
    // ranges (a small scratch cap, an Orin) walked every output's list from its start per range
    const int64_t begin = lower_bound(rows, ptr[o], end, row_lo);
    if (begin == end) continue;
    D* out = dst + o * c;
    for (int64_t x = threadIdx.x; x < c; x += blockDim.x) {
      D acc = out[x];
      for (int64_t j = begin; j < end; ++j) {
        const int64_t r = rows[j];
        if (r >= row_hi) break;
        acc += Acc<T>::load(src[(r - row_lo) * c + x]);
      }
      out[x] = acc;
    }
  }
}

template <typename T, typename D>
int scatter_add_csr(const T* src, int64_t c, const int64_t* ptr, const int32_t* rows,
                    int64_t n_out, int64_t row_lo, int64_t row_hi, D* dst, void* stream) {
  if (const int status = scatter_csr_args(c, n_out, row_lo, row_hi); status != kStatusOk) {
    return status;
  }
  if (!rows_to_do(n_out, c) || row_hi == row_lo) return kStatusOk;
  const cuda::RowLaunch l = cuda::row_launch(n_out, c);
  scatter_csr_kernel<T, D><<<l.grid, l.block, 0, cuda::as_stream(stream)>>>(
      src, c, ptr, rows, n_out, row_lo, row_hi, dst);
  return cuda::launch_status();
}

// dst[idx[i]] += src[i] with hardware atomics (idx[i] < 0 skipped). D is the accumulator type:
// float for f32 and f16 sources, double for f64.
template <typename T, typename D>
__global__ void scatter_atomic_kernel(const T* src, int64_t m, int64_t c, const int32_t* idx,
                                      D* dst) {
  const int64_t row_step = (int64_t)gridDim.x * blockDim.y;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.y + threadIdx.y; i < m; i += row_step) {
    const int32_t t = idx[i];
    if (t < 0) continue;
    const T* in = src + i * c;
    D* out = dst + (int64_t)t * c;
    for (int64_t x = threadIdx.x; x < c; x += blockDim.x) atomicAdd(out + x, Acc<T>::load(in[x]));
  }
}

template <typename T, typename D>
int scatter_add_atomic(const T* src, int64_t m, int64_t c, const int32_t* idx, D* dst,
                       void* stream) {
  if (m <= 0 || c <= 0) return kStatusOk;
  const cuda::RowLaunch l = cuda::row_launch(m, c);
  scatter_atomic_kernel<T, D><<<l.grid, l.block, 0, cuda::as_stream(stream)>>>(src, m, c, idx,
                                                                              dst);
  return cuda::launch_status();
}

const __half* as_half(const uint16_t* p) { return reinterpret_cast<const __half*>(p); }
__half* as_half(uint16_t* p) { return reinterpret_cast<__half*>(p); }

}  // namespace
}  // namespace lidarseg

LS_API int ls_gather_rows_f32_cuda(const float* src, int64_t n, int64_t c, const int32_t* idx,
                                   int64_t m, float* dst, void* stream) {
  return gather_rows(src, n, c, sizeof(float), idx, m, dst, stream);
}
LS_API int ls_gather_rows_f64_cuda(const double* src, int64_t n, int64_t c, const int32_t* idx,
                                   int64_t m, double* dst, void* stream) {
  return gather_rows(src, n, c, sizeof(double), idx, m, dst, stream);
}
LS_API int ls_gather_rows_f16_cuda(const uint16_t* src, int64_t n, int64_t c, const int32_t* idx,
                                   int64_t m, uint16_t* dst, void* stream) {
  return gather_rows(as_half(src), n, c, sizeof(__half), idx, m, as_half(dst), stream);
}

LS_API int ls_scatter_add_csr_f32_cuda(const float* src, int64_t c, const int64_t* ptr,
                                       const int32_t* rows, int64_t n_out, int64_t row_lo,
                                       int64_t row_hi, float* dst, void* stream) {
  return scatter_add_csr(src, c, ptr, rows, n_out, row_lo, row_hi, dst, stream);
}
LS_API int ls_scatter_add_csr_f64_cuda(const double* src, int64_t c, const int64_t* ptr,
                                       const int32_t* rows, int64_t n_out, int64_t row_lo,
                                       int64_t row_hi, double* dst, void* stream) {
  return scatter_add_csr(src, c, ptr, rows, n_out, row_lo, row_hi, dst, stream);
}
LS_API int ls_scatter_add_csr_f16_cuda(const uint16_t* src, int64_t c, const int64_t* ptr,
                                       const int32_t* rows, int64_t n_out, int64_t row_lo,
                                       int64_t row_hi, float* dst, void* stream) {
  return scatter_add_csr(as_half(src), c, ptr, rows, n_out, row_lo, row_hi, dst, stream);
}

LS_API int ls_scatter_add_atomic_f32_cuda(const float* src, int64_t m, int64_t c,
                                          const int32_t* idx, float* dst, void* stream) {
  return scatter_add_atomic(src, m, c, idx, dst, stream);
}
LS_API int ls_scatter_add_atomic_f64_cuda(const double* src, int64_t m, int64_t c,
                                          const int32_t* idx, double* dst, void* stream) {
  return scatter_add_atomic(src, m, c, idx, dst, stream);
}
LS_API int ls_scatter_add_atomic_f16_cuda(const uint16_t* src, int64_t m, int64_t c,
                                          const int32_t* idx, float* dst, void* stream) {
  return scatter_add_atomic(as_half(src), m, c, idx, dst, stream);
}
