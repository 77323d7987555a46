// Launch helpers shared by the CUDA twin (cuda/*.cu): the stream cast, grid sizing and the
// post-launch error check. Plain CUDA runtime only, no PyTorch headers.
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>

#include "common.h"

namespace lidarseg {
namespace cuda {

constexpr int kThreads = 256;           // threads per block for every kernel here
constexpr int64_t kMaxBlocks = 1 << 16;  // grid cap; kernels loop (grid-stride) over the rest

inline cudaStream_t as_stream(void* stream) { return static_cast<cudaStream_t>(stream); }

// Blocks for `work` items at `per_block` items per block, at least 1 and at most kMaxBlocks.
inline unsigned int num_blocks(int64_t work, int64_t per_block) {
  int64_t b = (work + per_block - 1) / per_block;
  if (b < 1) b = 1;
  if (b > kMaxBlocks) b = kMaxBlocks;
  return (unsigned int)b;
}

// Shape of a launch for row-wise kernels over a [rows, cols] matrix: threadIdx.x walks the
// columns of one row, threadIdx.y picks one of the rows the block handles at a time, and
// blockIdx.x strides over groups of rows. Only gridDim.x is used, so no 65535 limit applies.
struct RowLaunch {
  dim3 grid;
  dim3 block;
};

inline RowLaunch row_launch(int64_t rows, int64_t cols) {
  int tx = 1;
  while (tx < cols && tx < kThreads) tx *= 2;  // the next power of two >= cols, at most 256
  const int ty = kThreads / tx;
  RowLaunch l;
  l.block = dim3((unsigned int)tx, (unsigned int)ty, 1);
  l.grid = dim3(num_blocks(rows, ty), 1, 1);
  return l;
}

// Records a failed CUDA call for ls_last_error_cuda (status_cuda.cu) and returns kStatusCudaError;
// cudaSuccess returns kStatusOk.
int check(cudaError_t e, const char* what);

// Status for the launch just issued (a bad configuration or an earlier sticky error).
inline int launch_status() { return check(cudaGetLastError(), "kernel launch"); }

}  // namespace cuda
}  // namespace lidarseg
