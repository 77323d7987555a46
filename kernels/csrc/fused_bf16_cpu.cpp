// The bf16 twin of fused_cpu.cpp: input rows and weights in bf16, products summed in fp32 by
// AVX512_BF16 dot products (vdpbf16ps: per fp32 lane, acc += a[2i] * b[2i] + a[2i+1] * b[2i+1]),
// output, bias, residual and epilogue in fp32; the same walk over the map (fused_driver.h).
//
// The library is built for a named ISA level (or the build host), not for AVX512_BF16, so only the
// functions that use it are compiled for it (target attributes below), and they run only after
// ls_fused_bf16_lanes_cpu() has found the instructions on this CPU at run time.
//
// Weights come packed in pairs of input channels (the layout vdpbf16ps reads):
//   wp[k][p][o][j] = w[k][2p + j][o],  p < cin / 2, j in {0, 1}
// so one 64-byte load holds 16 output channels of two input channels, and one input row's two
// channels are one 32-bit broadcast. cin must be even (every MinkUNet width is).
// Other architectures (the aarch64 Orin build) compile only the entry points, which report no
// bf16 dot product, so the caller keeps fp32.
#include <string.h>

#include "amx_tiles.h"
#include "api.h"
#include "fused_driver.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define LS_HAVE_BF16_DOT 1
#define LS_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#else
#define LS_HAVE_BF16_DOT 0
#endif

namespace {

constexpr int kLanes = 16;  // fp32 accumulators per vector
#if LS_HAVE_BF16_DOT
constexpr int kRows = 6;    // map entries per tile: 6 x 4 accumulators + 4 weights + 1 input
constexpr int kVecs = 4;    // up to 4 vectors (64 output channels) per tile

// One tile: rows in[0..rows) of x times wp[:, :, col .. col + NV * 16), added into (or stored in,
// when kStore) the out rows.
template <int NV, bool kStore>
__attribute__((always_inline)) LS_BF16_TARGET inline void tile(
    const uint16_t* x, int64_t cin, const uint16_t* wp, int64_t cout, int64_t col,
    const int32_t* in, const int32_t* out_rows, int rows, float* out,
    const lidarseg::StoreAddend& add) {
  __m512 acc[kRows][NV];
  for (int r = 0; r < kRows; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
  const uint16_t* src[kRows];
  for (int r = 0; r < kRows; ++r) src[r] = x + (int64_t)in[r < rows ? r : 0] * cin;
  for (int64_t p = 0; p < cin / 2; ++p) {
    __m512bh wv[NV];
    for (int v = 0; v < NV; ++v) {
      wv[v] = (__m512bh)_mm512_loadu_si512(wp + (p * cout + col + v * kLanes) * 2);
    }
    for (int r = 0; r < kRows; ++r) {
      int32_t pair;
      memcpy(&pair, src[r] + 2 * p, sizeof(pair));
      const __m512bh s = (__m512bh)_mm512_set1_epi32(pair);
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], s, wv[v]);
    }
  }
  for (int r = 0; r < rows; ++r) {
    float* dst = out + (int64_t)out_rows[r] * cout + col;
    const float* res = kStore && add.residual ? add.residual + out_rows[r] * cout + col : nullptr;
    for (int v = 0; v < NV; ++v) {
      __m512 value = acc[r][v];
      if (!kStore) value = _mm512_add_ps(_mm512_loadu_ps(dst + v * kLanes), value);
      if (kStore && add.bias != nullptr) {
        value = _mm512_add_ps(value, _mm512_loadu_ps(add.bias + col + v * kLanes));
      }
      if (kStore && res != nullptr) value = _mm512_add_ps(value, _mm512_loadu_ps(res + v * kLanes));
      _mm512_storeu_ps(dst + v * kLanes, value);
    }
  }
}

// Entries [0, m) of one offset (outputs owned by this thread) times that offset's packed weight.
template <bool kStore>
LS_BF16_TARGET void entries_times_weight(const uint16_t* x, int64_t cin, const uint16_t* wp,
                                         int64_t cout, const int32_t* in,
                                         const int32_t* out_rows, int64_t m, float* out,
                                         const lidarseg::StoreAddend& add) {
  for (int64_t first = 0; first < m; first += kRows) {
    const int rows = (int)((m - first) < kRows ? (m - first) : kRows);
    const int64_t next_end = first + 2 * kRows < m ? first + 2 * kRows : m;
    lidarseg::prefetch_entries(x, cin * 2, out, cout, in, out_rows, first + kRows, next_end);
    for (int64_t col = 0; col < cout; col += kVecs * kLanes) {
      const int64_t vecs = (cout - col) / kLanes;
      const int32_t* i = in + first;
      const int32_t* o = out_rows + first;
      if (vecs >= 4) {
        tile<4, kStore>(x, cin, wp, cout, col, i, o, rows, out, add);
      } else if (vecs == 3) {
        tile<3, kStore>(x, cin, wp, cout, col, i, o, rows, out, add);
      } else if (vecs == 2) {
        tile<2, kStore>(x, cin, wp, cout, col, i, o, rows, out, add);
      } else {
        tile<1, kStore>(x, cin, wp, cout, col, i, o, rows, out, add);
      }
    }
  }
}

#if LS_HAVE_AMX
// What the AMX tiles of one offset's entries end in (amx_tiles.h: emit): their fp32 sums added
// into the out rows (or stored, with bias and residual, for the identity offset).
template <bool kStore>
struct AddTiles : lidarseg::amx::OutRows {
  lidarseg::StoreAddend add;

  __attribute__((always_inline)) LS_AMX_TARGET void operator()(int64_t first, int rows,
                                                               int64_t col, int nv,
                                                               const float* c) const {
    for (int r = 0; r < rows; ++r) {
      const int64_t row = out_rows[first + r];
      float* dst = out + row * cout + col;
      const float* res = kStore && add.residual ? add.residual + row * cout + col : nullptr;
      for (int v = 0; v < nv; ++v) {
        __m512 value = _mm512_load_ps(c + r * lidarseg::amx::kVecs * kLanes + v * kLanes);
        if (!kStore) value = _mm512_add_ps(_mm512_loadu_ps(dst + v * kLanes), value);
        if (kStore && add.bias != nullptr) {
          value = _mm512_add_ps(value, _mm512_loadu_ps(add.bias + col + v * kLanes));
        }
        if (kStore && res != nullptr) {
          value = _mm512_add_ps(value, _mm512_loadu_ps(res + v * kLanes));
        }
        _mm512_storeu_ps(dst + v * kLanes, value);
      }
    }
  }
};

template <bool kStore>
void entries_on_tiles(const float* x, int64_t cin, const uint16_t* wp, int64_t cout,
                      const int32_t* in, const int32_t* out_rows, int64_t m, float* out,
                      const lidarseg::StoreAddend& add) {
  lidarseg::amx::entries_times_weight<false>(
      lidarseg::amx::Bf16FromFp32Rows{x, cin}, (const uint8_t*)wp, cout, in, m,
      AddTiles<kStore>{{cout, out_rows, out}, add});
}
#endif

bool cpu_has_bf16_dot() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
}
#else
bool cpu_has_bf16_dot() { return false; }
#endif

}  // namespace

LS_API int ls_fused_bf16_lanes_cpu(void) { return cpu_has_bf16_dot() ? kLanes : 0; }

namespace {

// The walk of both bf16 entry points (fused_driver.h); x is bf16 for the AVX512_BF16 kernel,
// fp32 for the tiles (Bf16FromFp32Rows rounds it as it stages it).
template <bool kTiles, typename X>
int walk(const X* x, int64_t cin, const ls_bf16* w_packed, int64_t cout, const int32_t* in_idx,
         const int32_t* out_idx, const int64_t* bounds, const int32_t* kernel_order,
         int64_t num_kernels, int32_t identity, const float* bias, const float* residual,
         int32_t relu, int64_t num_out, float* out) {
#if LS_HAVE_BF16_DOT
  lidarseg::run_fused(
      w_packed, cin * cout, cin, cout, in_idx, out_idx, bounds, kernel_order, num_kernels,
      identity, bias, residual, relu, num_out, out,
      [=](bool store, const uint16_t* w_k, const int32_t* in, const int32_t* rows, int64_t m,
          float* dst, const lidarseg::StoreAddend& add) {
        if constexpr (kTiles) {
#if LS_HAVE_AMX
          if (store) {
            entries_on_tiles<true>(x, cin, w_k, cout, in, rows, m, dst, add);
          } else {
            entries_on_tiles<false>(x, cin, w_k, cout, in, rows, m, dst, add);
          }
#endif
        } else if (store) {
          entries_times_weight<true>(x, cin, w_k, cout, in, rows, m, dst, add);
        } else {
          entries_times_weight<false>(x, cin, w_k, cout, in, rows, m, dst, add);
        }
      });
  return lidarseg::kStatusOk;
#else
  (void)x, (void)cin, (void)w_packed, (void)cout, (void)in_idx, (void)out_idx, (void)bounds;
  (void)kernel_order, (void)num_kernels, (void)identity, (void)bias, (void)residual, (void)relu;
  (void)num_out, (void)out;
  return lidarseg::kStatusBadArgument;  // unreachable: no bf16 dot product on this architecture
#endif
}

// x[0, count) rounded to bf16 bits as torch rounds (to nearest, ties to even; a NaN becomes the
// quiet NaN 0x7FC0), split among the threads: integer arithmetic the compiler vectorizes.
void round_rows_to_bf16(const float* x, int64_t count, uint16_t* out) {
#pragma omp parallel for schedule(static) if (count >= 16 * lidarseg::kParallelRows)
  for (int64_t i = 0; i < count; ++i) {
    uint32_t bits;
    memcpy(&bits, x + i, sizeof(bits));
    const uint16_t rounded = (uint16_t)((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
    out[i] = (bits & 0x7FFFFFFFu) > 0x7F800000u ? (uint16_t)0x7FC0 : rounded;
  }
}

bool shape_ok(int64_t cin, int64_t cout, int64_t num_out) {
  return cout % kLanes == 0 && cin > 0 && cin % 2 == 0 && num_out >= 0;
}

}  // namespace

LS_API int ls_fused_conv_bf16_cpu(const float* x, int64_t num_in, ls_bf16* staged, int64_t cin,
                                  const ls_bf16* w_packed, int64_t cout, const int32_t* in_idx,
                                  const int32_t* out_idx, const int64_t* bounds,
                                  const int32_t* kernel_order, int64_t num_kernels,
                                  int32_t identity, const float* bias, const float* residual,
                                  int32_t relu, int64_t num_out, float* out) {
  if (!cpu_has_bf16_dot() || !shape_ok(cin, cout, num_out) || num_in < 0) {
    return lidarseg::kStatusBadArgument;
  }
  round_rows_to_bf16(x, num_in * cin, staged);
  return walk<false>(staged, cin, w_packed, cout, in_idx, out_idx, bounds, kernel_order,
                     num_kernels, identity, bias, residual, relu, num_out, out);
}

LS_API int ls_fused_conv_bf16_tiles_cpu(const float* x, int64_t cin, const ls_bf16* w_packed,
                                        int64_t cout, const int32_t* in_idx,
                                        const int32_t* out_idx, const int64_t* bounds,
                                        const int32_t* kernel_order, int64_t num_kernels,
                                        int32_t identity, const float* bias,
                                        const float* residual, int32_t relu, int64_t num_out,
                                        float* out) {
  if (!lidarseg::tiles_ready(lidarseg::TileKind::kBf16) || !shape_ok(cin, cout, num_out) ||
      !lidarseg::amx::shape_fits(cin * 2, cout)) {
    return lidarseg::kStatusBadArgument;
  }
  lidarseg::count_tile_conv();
  return walk<true>(x, cin, w_packed, cout, in_idx, out_idx, bounds, kernel_order, num_kernels,
                    identity, bias, residual, relu, num_out, out);
}
