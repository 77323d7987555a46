// The library's int8 entry points (api.h): which kernel runs (int8_kernels.h: the widest this
// CPU has, unless a narrower one was asked for), the argument checks every kernel shares, and
// the call into fused_int8_cpu.cpp or fused_int8_avx2_cpu.cpp.
#include <atomic>

#include "api.h"
#include "common.h"
#include "int8_kernels.h"

namespace {

using lidarseg::Int8Kind;

std::atomic<int32_t> g_asked{-1};  // the kind asked for (ls_fused_int8_kind_cpu), or -1: the best

bool cpu_runs(Int8Kind kind) {
  switch (kind) {
    case Int8Kind::kNone:
      return true;
    case Int8Kind::kAvx2:
      return lidarseg::cpu_has_avx2_int8();
    case Int8Kind::kAvxVnni:  // not implied by AVX512_VNNI (AMD Zen 4 has that alone)
      return lidarseg::cpu_has_avx_vnni();
    case Int8Kind::kAvx512Vnni:
      return lidarseg::cpu_has_avx512_vnni();
  }
  return false;
}

Int8Kind best_kind() {
  static const Int8Kind best = cpu_runs(Int8Kind::kAvx512Vnni) ? Int8Kind::kAvx512Vnni
                               : cpu_runs(Int8Kind::kAvxVnni)   ? Int8Kind::kAvxVnni
                               : cpu_runs(Int8Kind::kAvx2)      ? Int8Kind::kAvx2
                                                                : Int8Kind::kNone;
  return best;
}

Int8Kind kind_now() {
  const int32_t asked = g_asked.load(std::memory_order_relaxed);
  return asked < 0 ? best_kind() : static_cast<Int8Kind>(asked);
}

}  // namespace

LS_API int ls_fused_int8_kind_cpu(int32_t request, int32_t* kind) {
  if (kind == nullptr || request < -2 || request > (int32_t)Int8Kind::kAvx512Vnni ||
      (request >= 0 && !cpu_runs(static_cast<Int8Kind>(request)))) {
    return lidarseg::kStatusBadArgument;
  }
  if (request == -2) g_asked.store(-1, std::memory_order_relaxed);
  if (request >= 0) g_asked.store(request, std::memory_order_relaxed);
  *kind = (int32_t)kind_now();
  return lidarseg::kStatusOk;
}

LS_API int ls_fused_int8_lanes_cpu(void) { return (int)lidarseg::int8_lanes(kind_now()); }

LS_API int ls_quantize_rows_u8_cpu(const float* x, int64_t n, int64_t c, uint8_t* q,
                                   float* scale, int64_t* negative) {
  return ls_quantize_concat_u8_cpu(x, c, nullptr, 0, n, q, scale, negative);
}

LS_API int ls_quantize_concat_u8_cpu(const float* a, int64_t ca, const float* b, int64_t cb,
                                     int64_t n, uint8_t* q, float* scale, int64_t* negative) {
  const Int8Kind kind = kind_now();
  if (kind == Int8Kind::kNone || n < 0 || ca <= 0 || cb < 0 || (cb > 0 && b == nullptr)) {
    return lidarseg::kStatusBadArgument;
  }
  if (kind == Int8Kind::kAvx512Vnni) {
    lidarseg::quantize_concat_u8_512(a, ca, b, cb, n, q, scale, negative);
  } else {
    lidarseg::quantize_concat_u8_256(a, ca, b, cb, n, q, scale, negative);
  }
  return lidarseg::kStatusOk;
}

LS_API int ls_fused_conv_int8_cpu(const uint8_t* q, const float* row_scale, int64_t cin,
                                  const int8_t* w_packed, const float* w_scale, int64_t cout,
                                  const int32_t* in_idx, const int32_t* out_idx,
                                  const int64_t* bounds, const int32_t* kernel_order,
                                  int64_t num_kernels, int32_t identity, const float* bias,
                                  const float* residual, int32_t relu, int64_t num_out,
                                  float* out, uint8_t* q_out, float* scale_out,
                                  int64_t* q_failed, const float* q_also, int64_t also_cols,
                                  const uint8_t* sc_q, const float* sc_scale, int64_t sc_cin,
                                  const int8_t* sc_w, const float* sc_w_scale,
                                  const float* head_w, const float* head_b, int64_t classes,
                                  uint8_t* labels) {
  const Int8Kind kind = kind_now();
  const int64_t lanes = lidarseg::int8_lanes(kind);
  if (lanes == 0 || cout % lanes != 0 || cin <= 0 || cin % 4 != 0 || num_out < 0 ||
      (q_out != nullptr && (scale_out == nullptr || q_failed == nullptr)) ||
      (out == nullptr && q_out == nullptr && labels == nullptr) || also_cols < 0 ||
      (q_also != nullptr && (q_out == nullptr || also_cols == 0)) ||
      (sc_q != nullptr && (identity < 0 || sc_scale == nullptr || sc_cin <= 0 ||
                           sc_cin % 4 != 0 || sc_w == nullptr || sc_w_scale == nullptr)) ||
      (labels != nullptr && (q_out != nullptr || head_w == nullptr || head_b == nullptr ||
                             classes < 1 || classes > 32 || identity < 0 || !relu))) {
    return lidarseg::kStatusBadArgument;
  }
  const lidarseg::Int8Conv conv{
      q,        row_scale, cin,       w_packed,  w_scale,   cout,       in_idx,     out_idx,
      bounds,   kernel_order, num_kernels, identity, bias, residual,   relu,       num_out,
      out,      q_out,     scale_out, q_failed,  q_also,    also_cols,  sc_q,       sc_scale,
      sc_cin,   sc_w,      sc_w_scale, head_w,   head_b,    classes,    labels};
  if (kind == Int8Kind::kAvx512Vnni) {
    lidarseg::fused_conv_int8_512(conv);
  } else {
    lidarseg::fused_conv_int8_256(kind, conv);
  }
  return lidarseg::kStatusOk;
}
