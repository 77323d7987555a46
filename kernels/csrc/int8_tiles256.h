// The tiles of the 256-bit int8 kernels (fused_int8_avx2_cpu.cpp), included there twice: once
// for AVX_VNNI (LS_INT8_VNNI 1: vpdpbusd, four u8 * s8 products per int32 lane, weights in int8
// quads) and once for AVX2 (LS_INT8_VNNI 0: vpmaddwd on u8 and s8 widened to int16, two
// products per lane, weights in int16 pairs), each time inside its own namespace and under its
// own target attribute (LS_INT8_TILE_TARGET). Both sum the products exactly in int32 and scale
// each sum as fused_int8_cpu.cpp does, so they give its bits; only the dot step differs.
// No include guard: included once per kernel.

#if LS_INT8_VNNI
constexpr int kRows = 6;  // map entries per tile: 6 x 2 accumulators + 2 weights + 1 input
using Weight = int8_t;

// acc + four u8 * s8 products per int32 lane. As in fused_int8_cpu.cpp, the accumulators are
// the __v8si the instruction works on: through the __m256i intrinsic GCC 12 cast each one to
// v8si and back, and kept the accumulators of two-vector tiles on the stack.
LS_INT8_TILE_TARGET inline __v8si dot(__v8si acc, __v8si u8, __v8si s8) {
#if defined(__clang__)
  return (__v8si)_mm256_dpbusd_avx_epi32((__m256i)acc, (__m256i)u8, (__m256i)s8);
#else
  return __builtin_ia32_vpdpbusd_v8si(acc, u8, s8);
#endif
}
#else
constexpr int kRows = 4;  // 4 x 2 accumulators + 2 x 2 weights + 3 inputs
using Weight = int16_t;

// acc + two int16 * int16 products per int32 lane (an input's 0..255 and a weight's -127..127:
// no product, nor the sum of two, leaves int32)
LS_INT8_TILE_TARGET inline __v8si dot(__v8si acc, __v8si u16, __v8si s16) {
  return acc + (__v8si)_mm256_madd_epi16((__m256i)u16, (__m256i)s16);
}
#endif

constexpr int kVecs = 2;  // up to 2 vectors (16 output channels) per tile

// One row's four uint8 inputs from channel c on, in every lane
LS_INT8_TILE_TARGET inline __v8si quad(const uint8_t* src) {
  int32_t four;
  memcpy(&four, src, sizeof(four));
  return (__v8si)_mm256_set1_epi32(four);
}

// One vector of an entry's int32 sums scaled, added into (or stored in, with bias and residual,
// when kStore) its out row dst from col on: fused_int8_cpu.cpp's scale_into, 8 lanes wide.
template <bool kStore>
__attribute__((always_inline)) LS_INT8_TILE_TARGET inline void scale_into(
    __m256i sums, __m256 scale, float* dst, const float* bias, const float* res, int64_t col,
    int v) {
  const __m256 sum = _mm256_cvtepi32_ps(sums);
  const __m256 addend = !kStore           ? _mm256_loadu_ps(dst + v * kLanes)
                        : bias != nullptr ? _mm256_loadu_ps(bias + col + v * kLanes)
                                          : _mm256_setzero_ps();
  __m256 value = _mm256_fmadd_ps(sum, scale, addend);
  if (kStore && res != nullptr) value = _mm256_add_ps(value, _mm256_loadu_ps(res + v * kLanes));
  _mm256_storeu_ps(dst + v * kLanes, value);
}

// One tile: rows in[0..rows) of q times w[:, :, col .. col + NV * 8), scaled by the row's scale
// and the weight's, added into (or stored in, when kStore) the out rows.
template <int NV, bool kStore>
__attribute__((always_inline)) LS_INT8_TILE_TARGET inline void tile(
    const uint8_t* q, const float* row_scale, int64_t cin, const Weight* w, const float* w_scale,
    int64_t cout, int64_t col, const int32_t* in, const int32_t* out_rows, int rows, float* out,
    const lidarseg::StoreAddend& add) {
  __v8si acc[kRows][NV];
  for (int r = 0; r < kRows; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = (__v8si)_mm256_setzero_si256();
  const uint8_t* src[kRows];
  for (int r = 0; r < kRows; ++r) src[r] = q + (int64_t)in[r < rows ? r : 0] * cin;
  for (int64_t g = 0; g < cin / 4; ++g) {  // four input channels a step
#if LS_INT8_VNNI
    __v8si wv[NV];
    for (int v = 0; v < NV; ++v) {
      wv[v] = (__v8si)_mm256_loadu_si256((const __m256i*)(w + (g * cout + col + v * kLanes) * 4));
    }
    for (int r = 0; r < kRows; ++r) {
      const __v8si x = quad(src[r] + 4 * g);
      for (int v = 0; v < NV; ++v) acc[r][v] = dot(acc[r][v], x, wv[v]);
    }
#else
    __v8si lo[NV], hi[NV];  // the weights of channels 4g, 4g + 1 and of 4g + 2, 4g + 3
    for (int v = 0; v < NV; ++v) {
      const Weight* pair = w + (2 * g * cout + col + v * kLanes) * 2;  // channels 4g, 4g + 1
      lo[v] = (__v8si)_mm256_loadu_si256((const __m256i*)pair);
      hi[v] = (__v8si)_mm256_loadu_si256((const __m256i*)(pair + cout * 2));
    }
    // bytes 0, 1 (and 2, 3) of every lane's quad, each widened to int16
    const __m256i first = _mm256_set1_epi32((int32_t)0x80018000u);
    const __m256i second = _mm256_set1_epi32((int32_t)0x80038002u);
    for (int r = 0; r < kRows; ++r) {
      const __m256i x = (__m256i)quad(src[r] + 4 * g);
      const __v8si x0 = (__v8si)_mm256_shuffle_epi8(x, first);
      const __v8si x1 = (__v8si)_mm256_shuffle_epi8(x, second);
      for (int v = 0; v < NV; ++v) acc[r][v] = dot(dot(acc[r][v], x0, lo[v]), x1, hi[v]);
    }
#endif
  }
  __m256 ws[NV];
  for (int v = 0; v < NV; ++v) ws[v] = _mm256_loadu_ps(w_scale + col + v * kLanes);
  for (int r = 0; r < rows; ++r) {
    const __m256 rs = _mm256_set1_ps(row_scale[in[r]]);
    float* dst = out + (int64_t)out_rows[r] * cout + col;
    const float* res = kStore && add.residual ? add.residual + out_rows[r] * cout + col : nullptr;
    for (int v = 0; v < NV; ++v) {
      scale_into<kStore>((__m256i)acc[r][v], _mm256_mul_ps(ws[v], rs), dst, add.bias, res, col, v);
    }
  }
}

// Entries [0, m) of one offset (outputs owned by this thread) times that offset's packed weight.
template <bool kStore>
LS_INT8_TILE_TARGET void entries_times_weight(const uint8_t* q, const float* row_scale,
                                              int64_t cin, const Weight* w, const float* w_scale,
                                              int64_t cout, const int32_t* in,
                                              const int32_t* out_rows, int64_t m, float* out,
                                              const lidarseg::StoreAddend& add) {
  for (int64_t first = 0; first < m; first += kRows) {
    const int rows = (int)((m - first) < kRows ? (m - first) : kRows);
    const int64_t next_end = first + 2 * kRows < m ? first + 2 * kRows : m;
    lidarseg::prefetch_entries(q, cin, out, cout, in, out_rows, first + kRows, next_end);
    for (int64_t col = 0; col < cout; col += kVecs * kLanes) {
      const int32_t* i = in + first;
      const int32_t* o = out_rows + first;
      if (cout - col >= kVecs * kLanes) {
        tile<2, kStore>(q, row_scale, cin, w, w_scale, cout, col, i, o, rows, out, add);
      } else {
        tile<1, kStore>(q, row_scale, cin, w, w_scale, cout, col, i, o, rows, out, add);
      }
    }
  }
}

// The conv: fused_int8_cpu.cpp's walk (fused_driver.h) with these tiles; the 1x1 shortcut
// after the identity, and the block hook (quantize or head), as there.
void fused_conv(const lidarseg::Int8Conv& c) {
  const Weight* w = static_cast<const Weight*>(c.w);
  const Weight* sc_w = static_cast<const Weight*>(c.sc_w);
  lidarseg::run_fused(
      w, c.cin * c.cout, c.cin, c.cout, c.in_idx, c.out_idx, c.bounds, c.kernel_order,
      c.num_kernels, c.identity, c.bias, c.residual, c.relu, c.num_out, c.out,
      [&c, w, sc_w](bool store, const Weight* w_k, const int32_t* in, const int32_t* rows,
                    int64_t m, float* dst, const lidarseg::StoreAddend& add) {
        const float* s_k = c.w_scale + (w_k - w) / c.cin;  // (k * cin * cout) / cin
        if (!store) {
          entries_times_weight<false>(c.q, c.row_scale, c.cin, w_k, s_k, c.cout, in, rows, m,
                                      dst, add);
          return;
        }
        entries_times_weight<true>(c.q, c.row_scale, c.cin, w_k, s_k, c.cout, in, rows, m, dst,
                                   add);
        if (c.sc_q != nullptr) {  // the block's 1x1 shortcut, right after its identity
          entries_times_weight<false>(c.sc_q, c.sc_scale, c.sc_cin, sc_w, c.sc_w_scale, c.cout,
                                      rows, rows, m, dst, lidarseg::StoreAddend{nullptr, nullptr});
        }
      },
      AfterBlock{QuantizeBlock{c.cout, c.q_also, c.q_also == nullptr ? 0 : c.also_cols, c.q_out,
                               c.scale_out, c.q_failed},
                 HeadBlock{c.cout, c.head_w, c.head_b, c.classes, c.labels}});
}
