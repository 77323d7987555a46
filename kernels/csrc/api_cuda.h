// The CUDA twin's entry points (liblidarseg_cuda.so, cuda/*.cu, which include this file), in
// api.h's form: kernels/arguments.py reads their declarations here, one per function.
#pragma once
#include <stdint.h>

#include "api.h"

// ---- CUDA error reporting (cuda/status_cuda.cu). Every CUDA entry point records the text of a
// CUDA error it meets; ls_last_error_cuda copies the last one this host thread saw (the failing
// CUDA call and cudaGetErrorString) into buf (NUL-terminated, size bytes at most) and returns its
// cudaError_t (0: none). ls_sync_cuda waits for the stream and returns kStatusCudaError when
// something on it failed (kernels/backend.py calls it after every launch when LIDARSEG_CUDA_SYNC=1,
// so a fault inside a kernel is blamed on the op that launched it).
LS_API int ls_last_error_cuda(char* buf, int64_t size);
LS_API int ls_sync_cuda(void* stream);

// ---- CUDA twins (cuda/*.cu, liblidarseg_cuda.so): the same arguments as device pointers, plus
// the stream. Compaction and CSR construction on CUDA use torch ops (nonzero, stable sort) that
// produce the same order as the CPU functions of api.h, so no _cuda twin exists for them.
LS_API int ls_hash_build_cuda(const int32_t* coords, int64_t n, lidarseg::Slot* table,
                              int64_t capacity, int64_t* err, void* stream);
LS_API int ls_hash_insert_min_cuda(const int32_t* coords, int64_t n, int32_t stride,
                                   lidarseg::Slot* table, int64_t capacity, int64_t* slot_of_row,
                                   int64_t* err, void* stream);
LS_API int ls_kmap_lookup_cuda(const lidarseg::Slot* table, int64_t capacity,
                               const int32_t* out_coords, int64_t n_out, int32_t stride,
                               const int32_t* offsets, int64_t num_offsets, int32_t* nbr,
                               int64_t* counts, void* stream);
// f16 is passed as uint16_t (IEEE half bits) so the header needs no cuda_fp16.h.
LS_API int ls_gather_rows_f32_cuda(const float* src, int64_t n, int64_t c, const int32_t* idx,
                                   int64_t m, float* dst, void* stream);
LS_API int ls_gather_rows_f64_cuda(const double* src, int64_t n, int64_t c, const int32_t* idx,
                                   int64_t m, double* dst, void* stream);
LS_API int ls_gather_rows_f16_cuda(const uint16_t* src, int64_t n, int64_t c, const int32_t* idx,
                                   int64_t m, uint16_t* dst, void* stream);
// Deterministic scatter: one thread group per output row, sums in row order (as the CPU twin,
// row ranges included). The f16 variant adds into an fp32 copy of the output.
LS_API int ls_scatter_add_csr_f32_cuda(const float* src, int64_t c, const int64_t* ptr,
                                       const int32_t* rows, int64_t n_out, int64_t row_lo,
                                       int64_t row_hi, float* dst, void* stream);
LS_API int ls_scatter_add_csr_f64_cuda(const double* src, int64_t c, const int64_t* ptr,
                                       const int32_t* rows, int64_t n_out, int64_t row_lo,
                                       int64_t row_hi, double* dst, void* stream);
LS_API int ls_scatter_add_csr_f16_cuda(const uint16_t* src, int64_t c, const int64_t* ptr,
                                       const int32_t* rows, int64_t n_out, int64_t row_lo,
                                       int64_t row_hi, float* dst, void* stream);
// Fast scatter with float atomics (order varies run to run): dst[idx[i]] += src[i], idx < 0
// skipped. The f16 variant accumulates into an fp32 buffer.
LS_API int ls_scatter_add_atomic_f32_cuda(const float* src, int64_t m, int64_t c,
                                          const int32_t* idx, float* dst, void* stream);
LS_API int ls_scatter_add_atomic_f64_cuda(const double* src, int64_t m, int64_t c,
                                          const int32_t* idx, double* dst, void* stream);
LS_API int ls_scatter_add_atomic_f16_cuda(const uint16_t* src, int64_t m, int64_t c,
                                          const int32_t* idx, float* dst, void* stream);
