// The int8 conv kernels and what they take: the AVX-512 kernel (fused_int8_cpu.cpp), its 256-bit
// twins (fused_int8_avx2_cpu.cpp), and the entry points that pick one (int8_dispatch_cpu.cpp).
// Every kernel sums the same u8 * s8 products exactly in int32 and scales each entry's sum with
// the same fp32 operations, so all of them give the same bits.
#pragma once
#include <stdint.h>

namespace lidarseg {

// The kernels, narrowest first (ls_fused_int8_kind_cpu's answer; kernels/precision.py names them).
enum class Int8Kind : int32_t {
  kNone = 0,
  kAvx2 = 1,        // AVX2 vpmaddwd on u8 and s8 widened to int16: weights in int16 pairs
  kAvxVnni = 2,     // 256-bit AVX_VNNI vpdpbusd (Intel Core 12th gen on, Xeon 6 E-cores)
  kAvx512Vnni = 3,  // 512-bit AVX512_VNNI vpdpbusd, AMX tiles for wide rows where granted
};

// Output channels per vector of a kind: cout must be a multiple.
inline int64_t int8_lanes(Int8Kind kind) {
  return kind == Int8Kind::kAvx512Vnni ? 16 : kind == Int8Kind::kNone ? 0 : 8;
}

// A checked int8 conv call: ls_fused_conv_int8_cpu's arguments (api.h says what each is; w and
// sc_w point to int8 quads or, for kAvx2, int16 pairs: cin * cout elements an offset either way).
struct Int8Conv {
  const uint8_t* q;
  const float* row_scale;
  int64_t cin;
  const void* w;
  const float* w_scale;
  int64_t cout;
  const int32_t* in_idx;
  const int32_t* out_idx;
  const int64_t* bounds;
  const int32_t* kernel_order;
  int64_t num_kernels;
  int32_t identity;
  const float* bias;
  const float* residual;
  int32_t relu;
  int64_t num_out;
  float* out;
  uint8_t* q_out;
  float* scale_out;
  int64_t* q_failed;
  const float* q_also;
  int64_t also_cols;
  const uint8_t* sc_q;
  const float* sc_scale;
  int64_t sc_cin;
  const void* sc_w;
  const float* sc_w_scale;
  const float* head_w;
  const float* head_b;
  int64_t classes;
  uint8_t* labels;
};

// The kernels, called with checked arguments by int8_dispatch_cpu.cpp (the library's int8
// entry points): the conv and the row quantizer (ls_quantize_concat_u8_cpu's; *negative as
// there), each only where the CPU has what it needs (cpu_has_*).
// fused_int8_cpu.cpp: AVX512_VNNI, AMX tiles where granted.
bool cpu_has_avx512_vnni();
void fused_conv_int8_512(const Int8Conv& conv);
void quantize_concat_u8_512(const float* a, int64_t ca, const float* b, int64_t cb, int64_t n,
                            uint8_t* q, float* scale, int64_t* negative);
// fused_int8_avx2_cpu.cpp: kAvx2 or kAvxVnni.
bool cpu_has_avx2_int8();
bool cpu_has_avx_vnni();
void fused_conv_int8_256(Int8Kind kind, const Int8Conv& conv);
void quantize_concat_u8_256(const float* a, int64_t ca, const float* b, int64_t cb, int64_t n,
                            uint8_t* q, float* scale, int64_t* negative);

}  // namespace lidarseg
