// The int8 twin of fused_cpu.cpp: input rows as uint8 with one scale per row, weights as int8 with
// one scale per (offset, output channel), products summed exactly in int32 by AVX512_VNNI dot
// products (vpdpbusd: per int32 lane, acc += four u8 * s8 products), each entry's sum then scaled
// to fp32 and added into the fp32 output; bias, residual and epilogue in fp32; the same walk over
// the map (fused_driver.h).
//
// Rows are quantized at run time (ls_quantize_rows_u8_cpu): q = rint(x * (255 / max of the row)),
// scale = max / 255, so a row is its own calibration and nothing is calibrated ahead. Only rows
// without negative values are taken (every MinkUNet conv after the first reads ReLU outputs);
// the quantizer says when it met one, and the caller keeps bf16 or fp32 for that conv.
//
// As in fused_bf16_cpu.cpp, only the functions below that use AVX512_VNNI are compiled for it
// (target attributes), and they run only where int8_dispatch_cpu.cpp, which owns the library's
// int8 entry points, has found it; CPUs without it run the 256-bit twins of this kernel
// (fused_int8_avx2_cpu.cpp), which give the same bits.
//
// Weights come packed in quads of input channels (the layout vpdpbusd reads):
//   wq[k][g][o][j] = q(w[k][4g + j][o]),  g < cin / 4, j < 4
// so one 64-byte load holds 16 output channels of four input channels, and one input row's four
// channels are one 32-bit broadcast. cin must be a multiple of 4, cout of 16.
#include <string.h>

#include "amx_tiles.h"
#include "api.h"
#include "fused_driver.h"
#include "head.h"
#include "int8_kernels.h"

#if defined(__x86_64__)
// GCC 12's AVX-512 intrinsics (max, conversions, reductions) pass a deliberately undefined
// vector through to the builtins, and at -O3 -Wall -Werror, built for an ISA level below AVX-512
// under target attributes, it reports that vector as uninitialized inside its own header (GCC
// bug 105593, fixed in GCC 13). The warning is about the header, not this file.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#define LS_HAVE_INT8_DOT 1
#define LS_VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))
#include "quantize_u8.h"
#define LS_INT8_ROWS_TARGET LS_VNNI_TARGET
#else
#define LS_HAVE_INT8_DOT 0
#endif

namespace {

constexpr int kLanes = 16;  // int32 accumulators per vector
// Input rows narrower than this stay on AVX512_VNNI where the CPU has AMX tiles too: a k3 conv
// on the 60k voxels of seq00_000000 ran 10-15 % faster on VNNI at 16 and 32 channels, 12-31 %
// slower at 48 to 128 (the tiles' fixed cost per 16 entries against a short dot product).
constexpr int64_t kTilesMinCin = 48;
constexpr int64_t kQuantizeParallel = 1 << 18;  // values below which one thread quantizes

#if LS_HAVE_INT8_DOT
constexpr int kRows = 6;  // map entries per tile: 6 x 4 accumulators + 4 weights + 1 input
constexpr int kVecs = 4;  // up to 4 vectors (64 output channels) per tile

// acc + four u8 * s8 products per int32 lane (vpdpbusd). The accumulators are __v16si, the type
// the instruction works on: through the __m512i intrinsic GCC 12 casts every accumulator to
// v16si and back, and at 24 accumulators it then spills and reloads them on every step of the
// inner loop (the kernel ran at a third of the instruction's rate, no faster than bf16).
LS_VNNI_TARGET inline __v16si dot4(__v16si acc, __v16si u8, __v16si s8) {
#if defined(__clang__)
  return (__v16si)_mm512_dpbusd_epi32((__m512i)acc, (__m512i)u8, (__m512i)s8);
#else
  return __builtin_ia32_vpdpbusd_v16si(acc, u8, s8);
#endif
}

// One vector of an entry's int32 sums (output channels col + 16 v ..), scaled, added into (or
// stored in, with bias and residual, when kStore) its out row dst (from col on): the AVX512_VNNI
// tiles and the AMX ones both end here, so both give the same bits.
template <bool kStore>
__attribute__((always_inline)) LS_VNNI_TARGET inline void scale_into(
    __m512i sums, __m512 scale, float* dst, const float* bias, const float* res, int64_t col,
    int v) {
  // every step spelled out (fused multiply-adds, no separate multiply that the compiler could
  // contract with the next add in one inlined copy and not in another)
  const __m512 sum = _mm512_cvtepi32_ps(sums);
  const __m512 addend = !kStore           ? _mm512_loadu_ps(dst + v * kLanes)
                        : bias != nullptr ? _mm512_loadu_ps(bias + col + v * kLanes)
                                          : _mm512_setzero_ps();
  __m512 value = _mm512_fmadd_ps(sum, scale, addend);
  if (kStore && res != nullptr) value = _mm512_add_ps(value, _mm512_loadu_ps(res + v * kLanes));
  _mm512_storeu_ps(dst + v * kLanes, value);
}

// One tile: rows in[0..rows) of q times wq[:, :, col .. col + NV * 16), scaled by the row's scale
// and the weight's, added into (or stored in, when kStore) the out rows.
template <int NV, bool kStore>
__attribute__((always_inline)) LS_VNNI_TARGET inline void tile(
    const uint8_t* q, const float* row_scale, int64_t cin, const int8_t* wq,
    const float* w_scale, int64_t cout, int64_t col, const int32_t* in,
    const int32_t* out_rows, int rows, float* out, const lidarseg::StoreAddend& add) {
  __v16si acc[kRows][NV];
  for (int r = 0; r < kRows; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = (__v16si)_mm512_setzero_si512();
  const uint8_t* src[kRows];
  for (int r = 0; r < kRows; ++r) src[r] = q + (int64_t)in[r < rows ? r : 0] * cin;
  for (int64_t g = 0; g < cin / 4; ++g) {
    __v16si wv[NV];
    for (int v = 0; v < NV; ++v) {
      wv[v] = (__v16si)_mm512_loadu_si512(wq + (g * cout + col + v * kLanes) * 4);
    }
    for (int r = 0; r < kRows; ++r) {
      int32_t quad;
      memcpy(&quad, src[r] + 4 * g, sizeof(quad));
      const __v16si s = (__v16si)_mm512_set1_epi32(quad);
      for (int v = 0; v < NV; ++v) acc[r][v] = dot4(acc[r][v], s, wv[v]);
    }
  }
  __m512 ws[NV];
  for (int v = 0; v < NV; ++v) ws[v] = _mm512_loadu_ps(w_scale + col + v * kLanes);
  for (int r = 0; r < rows; ++r) {
    const __m512 rs = _mm512_set1_ps(row_scale[in[r]]);
    float* dst = out + (int64_t)out_rows[r] * cout + col;
    const float* res = kStore && add.residual ? add.residual + out_rows[r] * cout + col : nullptr;
    for (int v = 0; v < NV; ++v) {
      scale_into<kStore>((__m512i)acc[r][v], _mm512_mul_ps(ws[v], rs), dst, add.bias, res, col, v);
    }
  }
}

namespace rows_u8 = lidarseg::quantize_u8;
#include "int8_after_block.h"  // QuantizeBlock, HeadBlock, AfterBlock

// Entries [0, m) of one offset (outputs owned by this thread) times that offset's packed weight.
template <bool kStore>
LS_VNNI_TARGET void entries_times_weight(const uint8_t* q, const float* row_scale, int64_t cin,
                                         const int8_t* wq, const float* w_scale, int64_t cout,
                                         const int32_t* in, const int32_t* out_rows, int64_t m,
                                         float* out, const lidarseg::StoreAddend& add) {
  for (int64_t first = 0; first < m; first += kRows) {
    const int rows = (int)((m - first) < kRows ? (m - first) : kRows);
    const int64_t next_end = first + 2 * kRows < m ? first + 2 * kRows : m;
    lidarseg::prefetch_entries(q, cin, out, cout, in, out_rows, first + kRows, next_end);
    for (int64_t col = 0; col < cout; col += kVecs * kLanes) {
      const int64_t vecs = (cout - col) / kLanes;
      const int32_t* i = in + first;
      const int32_t* o = out_rows + first;
      if (vecs >= 4) {
        tile<4, kStore>(q, row_scale, cin, wq, w_scale, cout, col, i, o, rows, out, add);
      } else if (vecs == 3) {
        tile<3, kStore>(q, row_scale, cin, wq, w_scale, cout, col, i, o, rows, out, add);
      } else if (vecs == 2) {
        tile<2, kStore>(q, row_scale, cin, wq, w_scale, cout, col, i, o, rows, out, add);
      } else {
        tile<1, kStore>(q, row_scale, cin, wq, w_scale, cout, col, i, o, rows, out, add);
      }
    }
  }
}

#if LS_HAVE_AMX
// What the AMX tiles of one offset's entries end in (amx_tiles.h: emit): their int32 sums scaled
// into the out rows, as the AVX512_VNNI tiles do it.
template <bool kStore>
struct ScaleTiles : lidarseg::amx::OutRows {
  const float* row_scale;
  const float* w_scale;
  const int32_t* in;
  lidarseg::StoreAddend add;

  __attribute__((always_inline)) LS_AMX_TARGET void operator()(int64_t first, int rows,
                                                               int64_t col, int nv,
                                                               const int32_t* c) const {
    __m512 ws[lidarseg::amx::kVecs];
    for (int v = 0; v < nv; ++v) ws[v] = _mm512_loadu_ps(w_scale + col + v * kLanes);
    for (int r = 0; r < rows; ++r) {
      const __m512 rs = _mm512_set1_ps(row_scale[in[first + r]]);
      const int64_t row = out_rows[first + r];
      float* dst = out + row * cout + col;
      const float* res = kStore && add.residual ? add.residual + row * cout + col : nullptr;
      for (int v = 0; v < nv; ++v) {
        const __m512i sums = _mm512_load_si512(c + r * lidarseg::amx::kVecs * kLanes + v * kLanes);
        scale_into<kStore>(sums, _mm512_mul_ps(ws[v], rs), dst, add.bias, res, col, v);
      }
    }
  }
};

template <bool kStore>
void entries_on_tiles(const uint8_t* q, const float* row_scale, int64_t cin, const int8_t* wq,
                      const float* w_scale, int64_t cout, const int32_t* in,
                      const int32_t* out_rows, int64_t m, float* out,
                      const lidarseg::StoreAddend& add) {
  lidarseg::amx::entries_times_weight<true>(
      lidarseg::amx::ByteRows{q, cin}, (const uint8_t*)wq, cout, in, m,
      ScaleTiles<kStore>{{cout, out_rows, out}, row_scale, w_scale, in, add});
}
#endif

// Quantized input rows of a conv and how its products are made (AMX tiles or AVX512_VNNI).
struct Int8Rows {
  const uint8_t* q;
  const float* scale;
  int64_t cin;
  bool tiles;
};

// Entries in[0..m) of src times one offset's packed weight w_k (scales s_k), stored into or
// added to the out rows (on tiles or VNNI: the same bits).
template <bool kStore>
void multiply(const Int8Rows& src, const int8_t* w_k, const float* s_k, int64_t cout,
              const int32_t* in, const int32_t* rows, int64_t m, float* dst,
              const lidarseg::StoreAddend& add) {
#if LS_HAVE_AMX
  if (src.tiles) {
    entries_on_tiles<kStore>(src.q, src.scale, src.cin, w_k, s_k, cout, in, rows, m, dst, add);
    return;
  }
#endif
  entries_times_weight<kStore>(src.q, src.scale, src.cin, w_k, s_k, cout, in, rows, m, dst, add);
}

bool use_tiles(int64_t cin, int64_t cout) {
  return LS_HAVE_AMX && cin >= kTilesMinCin && lidarseg::tiles_ready(lidarseg::TileKind::kInt8) &&
         lidarseg::amx::shape_fits(cin, cout);
}
#endif

}  // namespace

namespace lidarseg {

#if LS_HAVE_INT8_DOT
bool cpu_has_avx512_vnni() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
}

void quantize_concat_u8_512(const float* a, int64_t ca, const float* b, int64_t cb, int64_t n,
                            uint8_t* q, float* scale, int64_t* negative) {
  const int64_t c = ca + cb;
  int64_t found = 0;
  constexpr int64_t kBatch = quantize_u8::kBatchRows;
  // without a ReLU quantize_batch only reads a's rows: the const_cast writes nothing
  float* rows = const_cast<float*>(a);
#pragma omp parallel for schedule(static) reduction(| : found) if (n * c >= kQuantizeParallel)
  for (int64_t r = 0; r < n; r += kBatch) {
    const float* more = cb > 0 ? b + r * cb : nullptr;
    found |= quantize_u8::quantize_batch(rows + r * ca, ca, more, cb,
                                         n - r < kBatch ? n - r : kBatch, false, q + r * c,
                                         scale + r) != 0;
  }
  *negative = found;
}

void fused_conv_int8_512(const Int8Conv& c) {
  const int8_t* w = static_cast<const int8_t*>(c.w);
  const int8_t* sc_w = static_cast<const int8_t*>(c.sc_w);
  const Int8Rows src{c.q, c.row_scale, c.cin, use_tiles(c.cin, c.cout)};
  const Int8Rows shortcut{c.sc_q, c.sc_scale, c.sc_cin,
                          c.sc_q != nullptr && use_tiles(c.sc_cin, c.cout)};
  if (src.tiles) count_tile_conv();
  run_fused(
      w, c.cin * c.cout, c.cin, c.cout, c.in_idx, c.out_idx, c.bounds, c.kernel_order,
      c.num_kernels, c.identity, c.bias, c.residual, c.relu, c.num_out, c.out,
      [&](bool store, const int8_t* w_k, const int32_t* in, const int32_t* rows, int64_t m,
          float* dst, const StoreAddend& add) {
        const float* s_k = c.w_scale + (w_k - w) / c.cin;  // (k * cin * cout) / cin
        if (!store) {
          multiply<false>(src, w_k, s_k, c.cout, in, rows, m, dst, add);
          return;
        }
        multiply<true>(src, w_k, s_k, c.cout, in, rows, m, dst, add);
        if (shortcut.q != nullptr) {  // the block's 1x1 shortcut, right after its identity
          multiply<false>(shortcut, sc_w, c.sc_w_scale, c.cout, rows, rows, m, dst,
                          StoreAddend{nullptr, nullptr});
        }
      },
      AfterBlock{QuantizeBlock{c.cout, c.q_also, c.q_also == nullptr ? 0 : c.also_cols, c.q_out,
                               c.scale_out, c.q_failed},
                 HeadBlock{c.cout, c.head_w, c.head_b, c.classes, c.labels}});
}
#else
bool cpu_has_avx512_vnni() { return false; }
void quantize_concat_u8_512(const float*, int64_t, const float*, int64_t, int64_t, uint8_t*,
                            float*, int64_t*) {}  // unreachable: no such CPU
void fused_conv_int8_512(const Int8Conv&) {}
#endif

}  // namespace lidarseg
