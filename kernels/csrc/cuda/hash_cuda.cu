// CUDA twin of hash_cpu.cpp: hash-table build, strided insert-min and kernel-map lookup. The key
// layout, hash, probe sequence and atomics all come from common.h (LS_HD), so the two twins build
// and probe identical tables. One thread per row; every kernel is a grid-stride loop.
#include <cuda_runtime.h>

#include "api_cuda.h"
#include "launch.h"

using namespace lidarseg;

// Kernels live in lidarseg::(anonymous), so every one of ours has "lidarseg" in its name (the
// GPU check's compute-sanitizer run filters on it).
namespace lidarseg {
namespace {

__global__ void hash_build_kernel(const int32_t* coords, int64_t n, Slot* table, uint64_t mask,
                                  int64_t* err) {
  const int64_t step = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
    const int32_t* c = coords + 4 * i;
    const int32_t b = c[0], x = c[1], y = c[2], z = c[3];
    if (!coord_in_range(b, x, y, z)) {
      report_error(err, kStatusOutOfRange, i);
      continue;
    }
    bool inserted = false;
    const int64_t slot = insert_or_find(table, mask, pack_key(b, x, y, z), &inserted);
    if (slot < 0) {
      report_error(err, kStatusProbeLimit, i);
    } else if (!inserted) {
      report_error(err, kStatusDuplicate, i);
    } else {
      table[slot].value = (int32_t)i;
    }
  }
}

__global__ void hash_insert_min_kernel(const int32_t* coords, int64_t n, int32_t stride,
                                       Slot* table, uint64_t mask, int64_t* slot_of_row,
                                       int64_t* err) {
  const int64_t step = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
    const int32_t* c = coords + 4 * i;
    const int32_t b = c[0];
    const int32_t x = floor_div(c[1], stride), y = floor_div(c[2], stride);
    const int32_t z = floor_div(c[3], stride);
    slot_of_row[i] = -1;
    if (!coord_in_range(b, c[1], c[2], c[3])) {  // then the coarse key is in range too
      report_error(err, kStatusOutOfRange, i);
      continue;
    }
    bool inserted = false;
    const int64_t slot = insert_or_find(table, mask, pack_key(b, x, y, z), &inserted);
    if (slot < 0) {
      report_error(err, kStatusProbeLimit, i);
      continue;
    }
    slot_of_row[i] = slot;
    atomic_min_i32(&table[slot].value, (int32_t)i);
  }
}

// One thread per output coordinate answers all K offsets, so the coordinate is read once and the
// K probes overlap. Writes to nbr[k * n_out + q] are coalesced across the warp. Hits are counted
// per warp with a ballot and added to counts[k] by lane 0: integer sums, so deterministic.
// The loop bound is uniform across the block, so every lane reaches every ballot.
__global__ void kmap_lookup_kernel(const Slot* table, uint64_t mask, const int32_t* out_coords,
                                   int64_t n_out, int32_t stride, const int32_t* offsets,
                                   int64_t num_offsets, int32_t* nbr, int64_t* counts) {
  const int64_t step = (int64_t)gridDim.x * blockDim.x;
  const unsigned int lane = threadIdx.x & 31u;
  unsigned long long* tally = reinterpret_cast<unsigned long long*>(counts);
  for (int64_t base = (int64_t)blockIdx.x * blockDim.x; base < n_out; base += step) {
    const int64_t q = base + threadIdx.x;
    const bool active = q < n_out;
    int32_t b = 0;
    int64_t bx = 0, by = 0, bz = 0;  // 64 bits: no wrap-around before the range check
    if (active) {
      const int32_t* c = out_coords + 4 * q;
      b = c[0];
      bx = (int64_t)c[1] * stride;
      by = (int64_t)c[2] * stride;
      bz = (int64_t)c[3] * stride;
    }
    for (int64_t k = 0; k < num_offsets; ++k) {
      bool hit = false;
      if (active) {
        const int32_t* d = offsets + 3 * k;
        const int32_t v = find_coord(table, mask, b, bx + d[0], by + d[1], bz + d[2]);
        nbr[k * n_out + q] = v;
        hit = v >= 0;
      }
      const unsigned int hits = __popc(__ballot_sync(0xffffffffu, hit));
      if (lane == 0 && hits != 0) atomicAdd(&tally[k], (unsigned long long)hits);
    }
  }
}

}  // namespace
}  // namespace lidarseg

LS_API int ls_hash_build_cuda(const int32_t* coords, int64_t n, Slot* table, int64_t capacity,
                              int64_t* err, void* stream) {
  if (!valid_table_rows(n, capacity)) return kStatusBadArgument;
  if (n == 0) return kStatusOk;
  const uint64_t mask = (uint64_t)capacity - 1;
  hash_build_kernel<<<cuda::num_blocks(n, cuda::kThreads), cuda::kThreads, 0,
                      cuda::as_stream(stream)>>>(coords, n, table, mask, err);
  return cuda::launch_status();
}

LS_API int ls_hash_insert_min_cuda(const int32_t* coords, int64_t n, int32_t stride, Slot* table,
                                   int64_t capacity, int64_t* slot_of_row, int64_t* err,
                                   void* stream) {
  if (!valid_table_rows(n, capacity) || stride < 1) {
    return kStatusBadArgument;
  }
  if (n == 0) return kStatusOk;
  const uint64_t mask = (uint64_t)capacity - 1;
  hash_insert_min_kernel<<<cuda::num_blocks(n, cuda::kThreads), cuda::kThreads, 0,
                           cuda::as_stream(stream)>>>(coords, n, stride, table, mask, slot_of_row,
                                                      err);
  return cuda::launch_status();
}

LS_API int ls_kmap_lookup_cuda(const Slot* table, int64_t capacity, const int32_t* out_coords,
                               int64_t n_out, int32_t stride, const int32_t* offsets,
                               int64_t num_offsets, int32_t* nbr, int64_t* counts,
                               void* stream) {
  if (!valid_capacity(capacity) || n_out < 0 || num_offsets < 0 || num_offsets > kMaxOffsets ||
      stride < 1) {
    return kStatusBadArgument;
  }
  const cudaStream_t s = cuda::as_stream(stream);
  // counts is zeroed even when there are no outputs, like the CPU twin.
  if (num_offsets > 0) {
    const int status = cuda::check(
        cudaMemsetAsync(counts, 0, sizeof(int64_t) * (size_t)num_offsets, s), "cudaMemsetAsync");
    if (status != kStatusOk) return status;
  }
  if (n_out == 0 || num_offsets == 0) return kStatusOk;
  const uint64_t mask = (uint64_t)capacity - 1;
  kmap_lookup_kernel<<<cuda::num_blocks(n_out, cuda::kThreads), cuda::kThreads, 0, s>>>(
      table, mask, out_coords, n_out, stride, offsets, num_offsets, nbr, counts);
  return cuda::launch_status();
}
