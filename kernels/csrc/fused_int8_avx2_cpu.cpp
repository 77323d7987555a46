// The 256-bit twins of the int8 conv (fused_int8_cpu.cpp) for CPUs without AVX512_VNNI: on
// AVX_VNNI (Intel Core 12th gen on, Xeon 6 E-cores: vpdpbusd on 8 lanes) and on plain AVX2
// (vpmaddwd on inputs and weights widened to int16). The same quantized rows, the same exact
// int32 sums, the same fp32 scaling: their outputs are fused_int8_cpu.cpp's bits
// (tests/kernels/test_int8.py compares them where a CPU runs both). fused_int8_cpu.cpp's entry
// points call in here for these kinds (int8_kernels.h); the tiles are int8_tiles256.h.
//
// Each kernel's functions are compiled for its own target (attributes): the library itself may
// be built for x86-64-v2, and AVX_VNNI code must not reach a CPU that has only AVX2.
#include <string.h>

#include "api.h"
#include "fused_driver.h"
#include "head.h"
#include "int8_kernels.h"

#if defined(__x86_64__)
#pragma GCC diagnostic ignored "-Wuninitialized"  // GCC 12's intrinsic headers (fused_int8_cpu.cpp)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#define LS_INT8_AVX2_TARGET __attribute__((target("avx2,fma")))
#include "quantize_u8_avx2.h"
#define LS_HAVE_INT8_256 1
#else
#define LS_HAVE_INT8_256 0
#endif

namespace {

constexpr int kLanes = 8;  // int32 accumulators, fp32 values per vector
constexpr int64_t kQuantizeParallel = 1 << 18;  // values below which one thread quantizes

#if LS_HAVE_INT8_256
namespace rows_u8 = lidarseg::quantize_u8_avx2;
#define LS_INT8_ROWS_TARGET LS_INT8_AVX2_TARGET
#include "int8_after_block.h"  // QuantizeBlock, HeadBlock, AfterBlock

namespace avx2 {
#define LS_INT8_VNNI 0
#define LS_INT8_TILE_TARGET LS_INT8_AVX2_TARGET
#include "int8_tiles256.h"
#undef LS_INT8_TILE_TARGET
#undef LS_INT8_VNNI
}  // namespace avx2

namespace avx_vnni {
#define LS_INT8_VNNI 1
#define LS_INT8_TILE_TARGET __attribute__((target("avx2,fma,avxvnni")))
#include "int8_tiles256.h"
#undef LS_INT8_TILE_TARGET
#undef LS_INT8_VNNI
}  // namespace avx_vnni
#endif

}  // namespace

namespace lidarseg {

#if LS_HAVE_INT8_256
bool cpu_has_avx2_int8() {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

bool cpu_has_avx_vnni() { return cpu_has_avx2_int8() && __builtin_cpu_supports("avxvnni"); }

void fused_conv_int8_256(Int8Kind kind, const Int8Conv& conv) {
  if (kind == Int8Kind::kAvxVnni) {
    avx_vnni::fused_conv(conv);
  } else {
    avx2::fused_conv(conv);
  }
}

void quantize_concat_u8_256(const float* a, int64_t ca, const float* b, int64_t cb, int64_t n,
                            uint8_t* q, float* scale, int64_t* negative) {
  constexpr int64_t kBatch = 16;  // rows a thread takes at a time
  const int64_t c = ca + cb;
  int64_t found = 0;
  // without a ReLU quantize_rows only reads a's rows: the const_cast writes nothing
  float* rows = const_cast<float*>(a);
#pragma omp parallel for schedule(static) reduction(| : found) if (n * c >= kQuantizeParallel)
  for (int64_t r = 0; r < n; r += kBatch) {
    const float* more = cb > 0 ? b + r * cb : nullptr;
    found |= !rows_u8::quantize_rows(rows + r * ca, ca, more, cb, n - r < kBatch ? n - r : kBatch,
                                     false, q + r * c, scale + r);
  }
  *negative = found;
}
#else
bool cpu_has_avx2_int8() { return false; }
bool cpu_has_avx_vnni() { return false; }
void fused_conv_int8_256(Int8Kind, const Int8Conv&) {}  // unreachable: no such CPU
void quantize_concat_u8_256(const float*, int64_t, const float*, int64_t, int64_t, uint8_t*,
                            float*, int64_t*) {}
#endif

}  // namespace lidarseg
