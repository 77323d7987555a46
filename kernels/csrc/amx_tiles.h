// AMX tiles for the fused int8 and bf16 kernels (fused_int8_cpu.cpp, fused_bf16_cpu.cpp): Intel's
// eight tile registers of 16 rows x 64 bytes, and the unit that multiplies them (tdpbusd: int32 +=
// u8 x s8 in quads, tdpbf16ps: fp32 += bf16 x bf16 in pairs). Where the CPU has them, one
// instruction does the work of 16 rows x 16 output channels x one 64-byte chunk of input row:
// AVX-512 dot products need 16 per row for the same.
//
// The walk over the map and the weights are the kernels' own (fused_driver.h, the quad and pair
// packings): a packed weight row is 16 output channels x 4 bytes of input channels, exactly one
// row of a B tile, so B tiles load straight from the packed weights (row stride cout * 4 bytes).
// Input rows are scattered, so the 16 rows of a tile are first copied side by side (A tiles need
// one stride); 16 consecutive input rows (the identity offset, runs along a column) load in place.
//
// Tile registers: 0-3 accumulate 16 entries x 16 output channels each (64 channels per pass);
// 4 and 5 hold a full 64-byte chunk of inputs (A) and weights (B), 6 and 7 the last, shorter chunk
// (input rows of 16 int8 or bf16 channels take only that one).
//
// Linux hands out the tile registers' 8 KB of state only to a process that asks
// (arch_prctl(ARCH_REQ_XCOMP_PERM)); tiles_granted() asks once. Everything here runs only after
// tiles_ready() said yes, and only in functions compiled for AMX (LS_AMX_TARGET).
#pragma once
#include <stdint.h>
#include <string.h>

#include <type_traits>

// GCC 11 and clang 12 are the first to know the AMX intrinsics and __builtin_cpu_supports names;
// older compilers build the library without tiles.
#if defined(__x86_64__) && defined(__linux__) && \
    ((defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && __GNUC__ >= 11))
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define LS_HAVE_AMX 1
// every CPU with AMX has these AVX-512 subsets too: the kernels' emit functors use them
#define LS_AMX_TARGET                                                                  \
  __attribute__((target("amx-tile,amx-int8,amx-bf16,avx512f,avx512bw,avx512vl,avx512vnni," \
                        "avx512bf16")))
#else
#define LS_HAVE_AMX 0
#endif

namespace lidarseg {

enum class TileKind : int { kInt8 = 1, kBf16 = 2 };  // bits of ls_amx_tiles_cpu's answer

// Whether the kernels of this kind run on AMX tiles: the CPU has them, Linux granted them and
// ls_amx_tiles_cpu has not turned them off (amx_cpu.cpp).
bool tiles_ready(TileKind kind);
// Counts one conv run on tiles (ls_amx_tiles_cpu reports the count: tests see that tiles ran).
void count_tile_conv();

namespace amx {

constexpr int kRows = 16;                 // map entries per tile (a tile's rows)
constexpr int kChunkBytes = 64;           // bytes of input row per A tile row
constexpr int kVecs = 4;                  // accumulator tiles: 64 output channels per pass
constexpr int64_t kMaxRowBytes = 1024;    // input row bytes the staging copy holds
constexpr int kMaxPasses = 4;             // column passes of 64: at most 256 output channels
constexpr int kCStride = kVecs * 16 * 4;  // bytes per row of the accumulators' copy

// Shapes the tiles take (the staging copies' sizes); others, never seen in a MinkUNet (at most
// 384 input and 256 output channels), stay on the AVX-512 kernels.
inline bool shape_fits(int64_t row_bytes, int64_t cout) {
  return row_bytes > 0 && row_bytes <= kMaxRowBytes && row_bytes % 4 == 0 && cout > 0 &&
         cout <= kMaxPasses * kVecs * 16;
}

}  // namespace amx

#if LS_HAVE_AMX
namespace amx {

struct alignas(64) TileConfig {  // ldtilecfg's 64-byte layout (palette 1)
  uint8_t palette;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

inline TileConfig config_for(int64_t row_bytes) {
  TileConfig c;
  memset(&c, 0, sizeof(c));
  c.palette = 1;
  const int tail = (int)(row_bytes % kChunkBytes);
  for (int t = 0; t < 6; ++t) c.colsb[t] = kChunkBytes, c.rows[t] = kRows;
  if (tail > 0) {
    c.colsb[6] = (uint16_t)tail, c.rows[6] = kRows;        // A: 16 rows x tail bytes
    c.colsb[7] = kChunkBytes, c.rows[7] = (uint8_t)(tail / 4);  // B: tail / 4 rows
  }
  return c;
}

// One input row into the staging copy: 64-byte vector moves, the last one masked (a call to
// memcpy per row cost more than the tile's arithmetic).
LS_AMX_TARGET inline void copy_row(const uint8_t* src, int64_t n, uint8_t* dst) {
  int64_t b = 0;
  for (; b + 64 <= n; b += 64) _mm512_storeu_si512(dst + b, _mm512_loadu_si512(src + b));
  if (b < n) {
    const __mmask64 m = (__mmask64)((1ULL << (n - b)) - 1);  // n - b < 64
    _mm512_mask_storeu_epi8(dst + b, m, _mm512_maskz_loadu_epi8(m, src + b));
  }
}

// What an emit functor writes: the out rows [*, cout] of the entries, entry e's at out_rows[e].
struct OutRows {
  int64_t cout;
  const int32_t* out_rows;
  float* out;

  float* row(int64_t e) const { return out + (int64_t)out_rows[e] * cout; }
};

// The sums of one tile (all its column passes) to emit.
template <typename Sum, typename Emit>
__attribute__((always_inline)) LS_AMX_TARGET inline void emit_tile(
    const Emit& emit, int64_t first, int rows, int64_t cout, int64_t passes,
    const int32_t (*sums)[kRows * kVecs * 16]) {
  for (int64_t p = 0; p < passes; ++p) {
    const int64_t col = p * kVecs * 16, left = (cout - col) / 16;
    emit(first, rows, col, (int)(left < kVecs ? left : kVecs), (const Sum*)sums[p]);
  }
}

#define LS_AMX_DOT(kInt8, acc, a, b) \
  do {                               \
    if constexpr (kInt8) {           \
      _tile_dpbusd(acc, a, b);       \
    } else {                         \
      _tile_dpbf16ps(acc, a, b);     \
    }                                \
  } while (0)

// One chunk of inputs in tile A times the same chunk of weights (B rows from w, column blocks
// 64 bytes apart) into accumulators 0 .. nv-1.
#define LS_AMX_CHUNK(kInt8, A, B, a_ptr, a_stride, w_ptr, w_stride, nv) \
  do {                                                                  \
    _tile_loadd(A, a_ptr, a_stride);                                    \
    _tile_loadd(B, w_ptr, w_stride);                                    \
    LS_AMX_DOT(kInt8, 0, A, B);                                         \
    if (nv > 1) {                                                       \
      _tile_loadd(B, (w_ptr) + 64, w_stride);                           \
      LS_AMX_DOT(kInt8, 1, A, B);                                       \
    }                                                                   \
    if (nv > 2) {                                                       \
      _tile_loadd(B, (w_ptr) + 128, w_stride);                          \
      LS_AMX_DOT(kInt8, 2, A, B);                                       \
    }                                                                   \
    if (nv > 3) {                                                       \
      _tile_loadd(B, (w_ptr) + 192, w_stride);                          \
      LS_AMX_DOT(kInt8, 3, A, B);                                       \
    }                                                                   \
  } while (0)

// Input rows already in the tiles' format (uint8 for int8, bf16 for bf16), row_bytes each.
struct ByteRows {
  const uint8_t* x;
  int64_t row_bytes;

  int64_t bytes() const { return row_bytes; }

  // The 16 rows idx[0 .. rows) side by side in buf (zeros below rows), or where they already
  // are: 16 consecutive rows (the identity offset, a run along a column) are read in place.
  LS_AMX_TARGET const uint8_t* stage(const int32_t* idx, int rows, uint8_t* buf) const {
    if (rows == kRows && idx[kRows - 1] - idx[0] == kRows - 1) return x + idx[0] * row_bytes;
    for (int r = 0; r < rows; ++r) {
      copy_row(x + (int64_t)idx[r] * row_bytes, row_bytes, buf + r * row_bytes);
    }
    if (rows < kRows) memset(buf + rows * row_bytes, 0, (kRows - rows) * row_bytes);
    return buf;
  }
};

// fp32 input rows of cin values, rounded to bf16 as they are staged (vcvtneps2bf16: to nearest
// even, as torch rounds, except that a subnormal input becomes zero): no separate bf16 copy.
struct Bf16FromFp32Rows {
  const float* x;
  int64_t cin;

  int64_t bytes() const { return cin * 2; }

  LS_AMX_TARGET const uint8_t* stage(const int32_t* idx, int rows, uint8_t* buf) const {
    for (int r = 0; r < rows; ++r) {
      const float* src = x + (int64_t)idx[r] * cin;
      uint16_t* dst = (uint16_t*)(buf + r * cin * 2);
      for (int64_t j = 0; j < cin; j += 16) {
        const __mmask16 m = cin - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (cin - j)) - 1);
        const __m256bh h = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, src + j));
        _mm256_mask_storeu_epi16(dst + j, m, (__m256i)h);
      }
    }
    if (rows < kRows) memset(buf + rows * cin * 2, 0, (kRows - rows) * cin * 2);
    return buf;
  }
};

// Rows in[0..m) of src (ByteRows, Bf16FromFp32Rows: src.bytes() staged bytes each) times the
// packed weight w (rows of cout * 4 bytes), 16 entries per tile; per tile and 64 output
// channels, emit(first, rows, col, nv, c) gets the products of entries first .. first + rows in
// c: row r, channel col + j at c[r * kVecs * 16 + j] (int32 for int8, fp32 for bf16),
// j < nv * 16. No software prefetch of the rows ahead: asking for the inputs and (to write)
// the out rows of the entries two tiles on made the int8 and bf16 networks 3-5 % slower on the
// Intel Xeon (the out rows of a block are in L2 already; the prefetches only took fill buffers).
//
// Software-pipelined by one tile: a tile's sums are handed to emit, and the next tile's inputs
// staged, after the following tile's products are under way. Tile loads and stores do not take
// values from the store buffer the way vector loads do: a tile load right after the stores that
// staged its rows, or vector loads right after a tile store, wait for those stores to reach the
// cache, and in this order nothing waits.
template <bool kInt8, typename Source, typename Emit,
          typename Sum = std::conditional_t<kInt8, int32_t, float>>
LS_AMX_TARGET void entries_times_weight(const Source& src, const uint8_t* w, int64_t cout,
                                        const int32_t* in, int64_t m, Emit emit) {
  const int64_t row_bytes = src.bytes();
  const TileConfig cfg = config_for(row_bytes);
  _tile_loadconfig(&cfg);
  alignas(64) uint8_t staged[2][kRows * kMaxRowBytes];
  alignas(64) int32_t c[2][kMaxPasses][kRows * kVecs * 16];
  const int64_t full = row_bytes / kChunkBytes, w_stride = cout * 4;
  const int64_t passes = (cout + kVecs * 16 - 1) / (kVecs * 16);
  const uint8_t* a_next = src.stage(in, (int)(m < kRows ? m : kRows), staged[0]);
  int64_t t = 0, first = 0;
  for (; first < m; ++t, first += kRows) {
    const uint8_t* a = a_next;
    for (int64_t p = 0; p < passes; ++p) {
      const int64_t col = p * kVecs * 16, left = (cout - col) / 16;
      const int64_t nv = left < kVecs ? left : kVecs;
      int32_t* sums = c[t & 1][p];
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      const uint8_t* w_col = w + col * 4;
      for (int64_t k = 0; k < full; ++k) {
        LS_AMX_CHUNK(kInt8, 4, 5, a + k * kChunkBytes, row_bytes, w_col + k * kRows * w_stride,
                     w_stride, nv);
      }
      if (row_bytes % kChunkBytes != 0) {
        LS_AMX_CHUNK(kInt8, 6, 7, a + full * kChunkBytes, row_bytes,
                     w_col + full * kRows * w_stride, w_stride, nv);
      }
      _tile_stored(0, sums, kCStride);
      if (nv > 1) _tile_stored(1, sums + 16, kCStride);
      if (nv > 2) _tile_stored(2, sums + 32, kCStride);
      if (nv > 3) _tile_stored(3, sums + 48, kCStride);
    }
    if (t > 0) emit_tile<Sum>(emit, first - kRows, kRows, cout, passes, c[(t - 1) & 1]);
    if (first + kRows < m) {
      const int rows = (int)(m - first - kRows < kRows ? m - first - kRows : kRows);
      a_next = src.stage(in + first + kRows, rows, staged[(t + 1) & 1]);
    }
  }
  if (t > 0) {
    const int64_t last = (t - 1) * kRows;
    emit_tile<Sum>(emit, last, (int)(m - last), cout, passes, c[(t - 1) & 1]);
  }
  _tile_release();
}

#undef LS_AMX_CHUNK
#undef LS_AMX_DOT

}  // namespace amx
#endif  // LS_HAVE_AMX

}  // namespace lidarseg
