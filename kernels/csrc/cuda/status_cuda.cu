// CUDA error text for the Python side: the last failed CUDA call of each host thread, kept until
// the next failure (api_cuda.h: ls_last_error_cuda, ls_sync_cuda).
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>

#include "api_cuda.h"
#include "launch.h"

namespace {

thread_local cudaError_t last_code = cudaSuccess;
thread_local char last_text[512] = "";

}  // namespace

namespace lidarseg {
namespace cuda {

int check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return kStatusOk;
  last_code = e;
  snprintf(last_text, sizeof(last_text), "%s: %s (%s)", what, cudaGetErrorString(e),
           cudaGetErrorName(e));
  return kStatusCudaError;
}

}  // namespace cuda
}  // namespace lidarseg

LS_API int ls_last_error_cuda(char* buf, int64_t size) {
  if (buf != nullptr && size > 0) {
    strncpy(buf, last_text, (size_t)size - 1);
    buf[size - 1] = '\0';
  }
  return (int)last_code;
}

LS_API int ls_sync_cuda(void* stream) {
  const int status = lidarseg::cuda::check(
      cudaStreamSynchronize(lidarseg::cuda::as_stream(stream)), "cudaStreamSynchronize");
  if (status != lidarseg::kStatusOk) return status;
  return lidarseg::cuda::check(cudaGetLastError(), "cudaGetLastError after synchronising");
}
