// The C entry points of the kernel libraries, one schema per op. The CPU twin (liblidarseg_cpu.so,
// *_cpu.cpp) and the CUDA twin (liblidarseg_cuda.so, cuda/*.cu) export the same names with the
// suffix _cpu / _cuda; CUDA variants take the stream as a trailing `void* stream` and device
// pointers everywhere. Python binds them with ctypes (kernels/backend.py) so neither build needs
// the PyTorch C++ headers; kernels/arguments.py reads this file and api_cuda.h (the CUDA twin's
// own declarations) to declare every function's argument types, so keep one declaration per
// function in the form `LS_API int name(type name, ...);`. Every function returns a status code
// from common.h (0 = ok); errors found inside kernels are reported through `err`, one int64 word
// that the caller fills with kNoError (-1) and the kernels lower to the packed minimum over
// (status, row) (common.h: report_error; device memory for CUDA).
#pragma once
#include <stdint.h>

#include "common.h"

#define LS_API extern "C" __attribute__((visibility("default")))

// bf16 values as their 16 bits (torch.bfloat16 tensors; a plain uint16_t pointer is fp16 bits).
typedef uint16_t ls_bf16;

// Inserts coords [n, 4] (batch, x, y, z) with value = row index into an empty table (all -1).
// err: kStatusOutOfRange / kStatusDuplicate / kStatusProbeLimit with an offending row.
LS_API int ls_hash_build_cpu(const int32_t* coords, int64_t n, lidarseg::Slot* table,
                             int64_t capacity, int64_t* err);

// Inserts each row's coarse key (floor(x / stride), batch kept) and keeps, per key, the smallest
// row index as the value (the table's values must start at INT32_MAX). slot_of_row[n] receives
// the slot of each row's key. err: kStatusOutOfRange (for the row's own coordinate, as every
// other entry point checks it) / kStatusProbeLimit with an offending row.
LS_API int ls_hash_insert_min_cpu(const int32_t* coords, int64_t n, int32_t stride,
                                  lidarseg::Slot* table, int64_t capacity, int64_t* slot_of_row,
                                  int64_t* err);

// nbr[k * n_out + q] = value of (b, x * stride + off[k].x, ...) for output q, or -1.
// counts[k] = number of hits of offset k. offsets is [K, 3].
LS_API int ls_kmap_lookup_cpu(const lidarseg::Slot* table, int64_t capacity,
                              const int32_t* out_coords, int64_t n_out, int32_t stride,
                              const int32_t* offsets, int64_t num_offsets, int32_t* nbr,
                              int64_t* counts);

// Compacts nbr [K, n_out] into (in, out) pairs, offset-major then output-ascending; starts[k] is
// the first entry of offset k (an exclusive prefix sum of counts).
LS_API int ls_kmap_compact_cpu(const int32_t* nbr, int64_t num_offsets, int64_t n_out,
                               const int64_t* starts, int32_t* in_idx, int32_t* out_idx);

// Stable counting sort of keys [m] (entries < 0 are skipped): ptr[num_keys + 1], rows[#kept].
LS_API int ls_csr_by_key_cpu(const int32_t* keys, int64_t m, int64_t num_keys, int64_t* ptr,
                             int32_t* rows);

// out[r] = the index of the largest value of row r of x [n, c] (the first of equal ones; the
// first NaN where the row has one, as torch.argmax); c in 1..256.
LS_API int ls_argmax_rows_u8_cpu(const float* x, int64_t n, int64_t c, uint8_t* out);
// out[r] = argmax over o < cout of x[r] . w_t[:, o] + bias[o] (as ls_argmax_rows_u8_cpu picks),
// x [n, cin], w_t [cin, 32] (zero beyond cout), bias [32]; cout in 1..32. The logits are never
// written.
LS_API int ls_linear_argmax_u8_cpu(const float* x, int64_t n, int64_t cin, const float* w_t,
                                   const float* bias, int64_t cout, uint8_t* out);
// dst[i] = src[idx[i]] (a zero row where idx[i] < 0); src [n, c], dst [m, c].
LS_API int ls_gather_rows_f32_cpu(const float* src, int64_t n, int64_t c, const int32_t* idx,
                                  int64_t m, float* dst);
LS_API int ls_gather_rows_f64_cpu(const double* src, int64_t n, int64_t c, const int32_t* idx,
                                  int64_t m, double* dst);

// dst[o] += sum of src[rows[j] - row_lo] for j in [ptr[o], ptr[o + 1]) with rows[j] in
// [row_lo, row_hi), in that order (deterministic): src holds the buffer rows [row_lo, row_hi) of
// a scatter whose CSR (ptr, rows; each output's rows ascending) covers the whole buffer, so a
// scatter done range by range makes the same additions as one call.
LS_API int ls_scatter_add_csr_f32_cpu(const float* src, int64_t c, const int64_t* ptr,
                                      const int32_t* rows, int64_t n_out, int64_t row_lo,
                                      int64_t row_hi, float* dst);
LS_API int ls_scatter_add_csr_f64_cpu(const double* src, int64_t c, const int64_t* ptr,
                                      const int32_t* rows, int64_t n_out, int64_t row_lo,
                                      int64_t row_hi, double* dst);

// dst[idx[i]] += src[i] for i in [0, m), idx < 0 skipped. The caller guarantees that the
// non-negative idx are distinct (true for the rows of one kernel offset), so rows update in
// parallel without atomics and every output row sees its offsets in call order.
LS_API int ls_scatter_add_unique_f32_cpu(const float* src, int64_t m, int64_t c,
                                         const int32_t* idx, float* dst);
LS_API int ls_scatter_add_unique_f64_cpu(const double* src, int64_t m, int64_t c,
                                         const int32_t* idx, double* dst);

// Fused gather-GEMM-scatter over the map (fused_cpu.cpp): for each kernel index k in
// kernel_order, out[out_idx[e]] += x[in_idx[e]] @ w[k] for e in [bounds[k], bounds[k + 1]).
// With identity >= 0 (a submanifold map's centre, num_in == num_out) every row first gets
// out[q] = x[q] @ w[identity]; with identity = -1 every row starts at zero (cleared block by
// block, in cache, just before the offsets add into it): either way out needs no initial
// values. Each offset's entries must be sorted by out_idx (kmap.py keeps maps
// that way). Then, per row, out += bias [cout] and out += residual [num_out, cout] (each when
// not NULL), and out = max(out, 0) when relu != 0: a folded BatchNorm, a residual block's
// shortcut and its ReLU (models/fold.py). x [n_in, cin],
// w [K, cin, cout], out [num_out, cout]; cout must be a multiple of ls_fused_lanes_cpu() (the
// vector width this build was compiled for).
LS_API int ls_fused_lanes_cpu(void);
LS_API int ls_fused_conv_f32_cpu(const float* x, int64_t cin, const float* w, int64_t cout,
                                 const int32_t* in_idx, const int32_t* out_idx,
                                 const int64_t* bounds, const int32_t* kernel_order,
                                 int64_t num_kernels, int32_t identity, const float* bias,
                                 const float* residual, int32_t relu, int64_t num_out,
                                 float* out);

// The bf16 twin of ls_fused_conv_f32_cpu (fused_bf16_cpu.cpp): x [num_in, cin] in fp32 is first
// rounded to bf16 into staged [num_in, cin] (to nearest even, as torch rounds; the caller's
// scratch, rows split among the threads), the weights in bf16 (uint16_t bits), products summed
// in fp32 (AVX512_BF16 dot products); bias, residual and out in fp32 as above. w_packed holds
// the weights in pairs of input channels, w_packed[k][p][o][j] = w[k][2p + j][o] (p < cin / 2),
// so cin must be even; cout must be a multiple of 16. ls_fused_bf16_lanes_cpu() is 16 where
// this CPU has AVX512_BF16 (checked at run time: the library is not compiled for it) and 0
// where it has not; the conv then returns kStatusBadArgument.
LS_API int ls_fused_bf16_lanes_cpu(void);
LS_API int ls_fused_conv_bf16_cpu(const float* x, int64_t num_in, ls_bf16* staged, int64_t cin,
                                  const ls_bf16* w_packed, int64_t cout, const int32_t* in_idx,
                                  const int32_t* out_idx, const int64_t* bounds,
                                  const int32_t* kernel_order, int64_t num_kernels,
                                  int32_t identity, const float* bias, const float* residual,
                                  int32_t relu, int64_t num_out, float* out);
// The same conv on AMX tiles (amx_tiles.h), where ls_amx_tiles_cpu reports bf16 tiles (else
// kStatusBadArgument), reading x [n_in, cin] in fp32: each row is rounded to bf16 as it is
// staged for a tile (to nearest even, as torch rounds, except that a subnormal value becomes
// zero), so no bf16 copy of x is made. The products are summed in fp32 as above, in another
// order. cin * 2 <= 1024 bytes and cout <= 256.
LS_API int ls_fused_conv_bf16_tiles_cpu(const float* x, int64_t cin, const ls_bf16* w_packed,
                                        int64_t cout, const int32_t* in_idx,
                                        const int32_t* out_idx, const int64_t* bounds,
                                        const int32_t* kernel_order, int64_t num_kernels,
                                        int32_t identity, const float* bias,
                                        const float* residual, int32_t relu, int64_t num_out,
                                        float* out);

// The int8 twin (int8_dispatch_cpu.cpp picks the kernel: int8_kernels.h): q [n_in, cin] uint8
// input rows with row_scale [n_in] (x ~ q * row_scale), w_packed the int8 weights wq packed in
// groups of input channels, four int8 (quads) or, for the AVX2 kernel, two int16 (pairs):
// w_packed[k][g][o][j] = wq[k][G g + j][o] (G = 4 or 2, g < cin / G), with w_scale
// [num_kernels, cout] (w ~ wq * w_scale); each entry's products summed exactly in int32, times
// row_scale * w_scale in fp32, added into out; bias, residual and out in fp32 as above. cin a
// multiple of 4, cout of ls_fused_int8_lanes_cpu(). Every kernel gives the same bits.
// ls_fused_int8_kind_cpu: *kind = the kernel that runs, 3 (AVX512_VNNI, AMX tiles where
// granted), 2 (256-bit AVX_VNNI), 1 (AVX2, weights in pairs) or 0 (none: the int8 calls return
// kStatusBadArgument); the widest this CPU has (CPUID, checked at run time) unless request
// (-1: only ask) named another this CPU runs, for every thread from then on (-2: the widest
// again). ls_fused_int8_lanes_cpu() is its output channels per vector: 16, 8, 8 or 0.
// With q_out (and scale_out, q_failed) not NULL the conv also quantizes its out rows as
// ls_quantize_rows_u8_cpu would (the same bits), each block of rows once it is final, while it
// is in cache: q_out [num_out, cout], scale_out [num_out]; *q_failed |= 1 where some row has a
// negative, NaN or infinite value (q_out then means nothing). The next int8 conv reads them
// instead of quantizing its input again. out may then be NULL: the fp32 rows are made block by
// block in a per-thread buffer and never written out (a residual block's first conv, whose
// output only the second reads, quantized). With q_also [num_out, also_cols] as well, each row
// quantized is the out row and q_also's row side by side (q_out [num_out, cout + also_cols],
// one scale over both), as ls_quantize_concat_u8_cpu would quantize them (a decoder's
// upsampling and the skip rows it is concatenated with). With sc_q (a 1x1 conv's quantized
// input rows [num_out, sc_cin], their scales, its packed weight [1, sc_cin / 4, cout, 4] and
// scales [cout]; identity >= 0) that conv's products are added into each out row right after
// the identity offset's: a residual block's shortcut, never written out (its bias goes in
// bias). With labels [num_out] (and head_w [cout, 32], head_b [32], classes; relu, identity >= 0,
// no q_out) each out row's class under that head, as ls_linear_argmax_u8_cpu gives it, goes to
// labels instead: the network's last conv and its head in one pass (out may be NULL).
// ls_quantize_rows_u8_cpu: per row of x [n, c], q = rint(x * (255 / row max)) and scale =
// row max / 255 (a row of zeros: q 0, scale 0); *negative = 1 when some value is negative (-0.0
// too: its sign bit is set), NaN or inf (q then means nothing: the caller keeps another
// precision); where an int8 kernel runs, as the conv.
LS_API int ls_fused_int8_kind_cpu(int32_t request, int32_t* kind);
LS_API int ls_fused_int8_lanes_cpu(void);
// Whether the int8 and bf16 convs run on AMX tiles (amx_tiles.h), where the CPU has them and
// Linux grants them: *kinds = 1 (int8) | 2 (bf16) for those that do, *convs = how many convs
// ran on tiles since the process started. request -1 only asks; 0 turns tiles off, 1 back on
// (the default), for every thread, to compare the two kernels: on tiles the int8 conv gives
// the same bits as on AVX512_VNNI.
LS_API int ls_amx_tiles_cpu(int32_t request, int32_t* kinds, int64_t* convs);
// kStatusOk where a conv with input rows of row_bytes bytes and cout outputs fits the tiles'
// staging copies (at most 1024 bytes a row, 256 outputs), else kStatusBadArgument.
LS_API int ls_amx_shape_fits_cpu(int64_t row_bytes, int64_t cout);
LS_API int ls_quantize_rows_u8_cpu(const float* x, int64_t n, int64_t c, uint8_t* q,
                                   float* scale, int64_t* negative);
// The same for the rows of a [n, ca] and b [n, cb] side by side, as if concatenated (q [n,
// ca + cb], one scale per row over both); cb may be 0 (b then unused).
LS_API int ls_quantize_concat_u8_cpu(const float* a, int64_t ca, const float* b, int64_t cb,
                                     int64_t n, uint8_t* q, float* scale, int64_t* negative);
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
                                  uint8_t* labels);

// Per kernel index, the entries reordered by output row (each offset's outputs are distinct).
LS_API int ls_sort_entries_by_out_cpu(const int32_t* in_idx, const int32_t* out_idx,
                                      const int64_t* bounds, int64_t num_kernels, int64_t num_out,
                                      int32_t* in_sorted, int32_t* out_sorted);

// Submanifold neighbour table of coords [n, 4] onto themselves for offsets [K, 3] with every
// component in {-1, 0, 1} (kernel 3, dilation 1), K <= 27: the same nbr [K, n] and counts [K] as
// ls_kmap_lookup_cpu on a table of coords, computed through 4x4x4 voxel blocks with no voxel table
// (block_kmap_cpu.cpp; rows in any order).
// err: kStatusOutOfRange / kStatusDuplicate / kStatusProbeLimit with an offending row.
LS_API int ls_submanifold_nbr_cpu(const int32_t* coords, int64_t n, const int32_t* offsets,
                                  int64_t num_offsets, int32_t* nbr, int64_t* counts,
                                  int64_t* err);

// The same nbr [13, n] and counts [13] as ls_submanifold_nbr_cpu for the half offsets of a
// 3x3x3 kernel (kernel indices 0..12, dilation 1), by merge joins over packed keys; it applies
// only when coords are in strictly ascending (batch, x, y, z) order with no coordinate on the
// edge of the key range. *applied = 1 when it did the work, 0 when the caller must use
// ls_submanifold_nbr_cpu instead (not an error). err: kStatusOutOfRange / kStatusDuplicate.
LS_API int ls_sorted_submanifold_nbr_cpu(const int32_t* coords, int64_t n, int32_t* nbr,
                                         int64_t* counts, int64_t* applied, int64_t* err);

// The whole submanifold map of those coords without its centre, where that applies (as
// above): kernel indices 0..12 (entries by output row, half offset k from the prefix of the
// counts before it), then their mirrors 26 - k for k = 12 .. 0 with in and out swapped (on
// sorted coords the swap keeps each mirror sorted by its output row); counts [13] per half
// offset, in_idx / out_idx [2 * sum(counts)] of capacity entries (at least 26 n: every
// neighbour present). No nbr is made: each thread keeps only its hits, then places them.
LS_API int ls_sorted_submanifold_map_cpu(const int32_t* coords, int64_t n, int32_t* in_idx,
                                         int32_t* out_idx, int64_t capacity, int64_t* counts,
                                         int64_t* applied, int64_t* err);

// Downsampling map with kernel == stride (1..8), padding 0, on coords in strictly ascending
// (batch, x, y, z) order: out_coords [num_out, 4] are the distinct floor(coords / stride) in
// ascending order, and every row i is one entry (in = i, out = its parent) of the kernel index
// of its position in the parent cell; entries offset-major, then by output row (n entries in
// all, counts [stride^3] per kernel index). Buffers hold n rows. *applied = 0 (not an error)
// when coords are not sorted: the caller then takes the hash path. err: kStatusOutOfRange /
// kStatusDuplicate.
LS_API int ls_sorted_downsample_cpu(const int32_t* coords, int64_t n, int32_t stride,
                                    int32_t* out_coords, int32_t* in_idx, int32_t* out_idx,
                                    int64_t* counts, int64_t* num_out, int64_t* applied,
                                    int64_t* err);

// ---- The voxelizer's per-point passes (voxel_keys_cpu.cpp, voxel_order_cpu.cpp,
// voxel_cpu.cpp; host only: the voxelizer runs on the host). One frame's points [n, cols] (x, y,
// z first); params = {voxel_size, max_xy, z_lo, z_hi}. A point is kept when x, y, z are finite,
// |x| and |y| <= max_xy and z_lo <= z <= z_hi (float32 comparisons).
// keep[i] = whether point i is kept by that rule; counts [3] {non-finite, out of range, rows
// whose columns after x, y, z need cleaning: column 3 outside 0 .. params[4] or NaN, or a later
// column not finite}; valid_points' params carry that bound as a fifth value.
LS_API int ls_valid_points_cpu(const float* points, int64_t n, int64_t cols, const float* params,
                               uint8_t* keep, int64_t* counts);
// A kept point's cell is floor(coord / voxel_size) (float32 division), packed as batch << 51 |
// (x - origin[0]) << 34 | (y - origin[1]) << 17 | (z - origin[2]). Blocks of 2^shift cells per
// axis (block = {shift, then the bits of a block key's batch, x, y, z}): a block key packs the
// batch and each axis's cell >> shift in those widths, batch first, as one int32 (at most 31
// bits) or the two halves of 64 bits (words: 2, at most 63). A cell outside [0, 2^17) or whose
// block field does not fit its width fails with kStatusOutOfRange and the point's row in err.
// run_keys [n] receives the key of each run of equal consecutive kept keys, run_of_point[i]
// first_run + that run's index (-1: point ignored); block_words [n, words] a key per row of
// blocks, at most one per run of consecutive points in one block (a block given out lately
// takes its earlier row), and block_run [n] first_row + the row of each run's block; counts [4]
// {non-finite points, out-of-range points, runs, block rows}.
LS_API int ls_voxel_keys_cpu(const float* points, int64_t n, int64_t cols, const float* params,
                             const int32_t* origin, const int32_t* block, int64_t batch,
                             int64_t first_run, int64_t first_row, int64_t* run_keys,
                             int32_t* run_of_point, int32_t* block_run, int32_t* block_words,
                             int64_t* counts, int64_t* err);
// For every point i, v = voxel_of_run[run_of_point[i]] (-1 where run_of_point[i] is -1, an
// ignored point) into voxel_of_point[i], and where v >= 0, in point order: sums[v, j] += feature j
// (points[i, feature_cols[j]] * feature_scales[j] in float32; a column < 0 is 0) as float64, and
// counts[v] += 1: the sums numpy's bincount makes. sums [num_voxels, num_features], counts
// [num_voxels], set to 0 first when clear (a batch's first frame); means (NULL: not wanted; a
// batch's last frame) [num_voxels, num_features] = float32(sums / max(counts, 1)): numpy's
// float64 division, then one rounding. kStatusBadArgument for a run outside [-1, runs), a
// voxel outside [0, num_voxels) or more than 8 features.
LS_API int ls_voxel_sums_cpu(const float* points, int64_t n, int64_t cols,
                             const int32_t* feature_cols, const float* feature_scales,
                             int64_t num_features, const int32_t* run_of_point,
                             const int32_t* voxel_of_run, int64_t runs, int64_t num_voxels,
                             int64_t clear, int64_t* voxel_of_point, double* sums,
                             int64_t* counts, float* means);
// The voxels of a batch from its runs (ls_voxel_keys_cpu) once a hash set has given each block
// row b a slot[b] in [0, num_slots) (the block rows of ls_voxel_keys_cpu with the same shift,
// 3..6; block_run[r] the row of run r's block): bitmaps of the cells of each slot used find the
// first run of each key, and their set bits number the distinct keys. coords [runs, 4] (room for
// every run) gets the *num_voxels distinct (batch, x, y, z) in ascending key order (fields plus
// origin), voxel_of_run[r] the row of run r's voxel there. kStatusBadArgument for a negative
// key, a slot or block run out of range, or two blocks given one slot.
LS_API int ls_voxel_order_cpu(const int64_t* run_keys, int64_t runs, const int32_t* block_run,
                              const int32_t* slot, int64_t block_runs, int64_t num_slots,
                              int64_t shift, const int32_t* origin, int32_t* voxel_of_run,
                              int32_t* coords, int64_t* num_voxels);

// ---- A response's labels as JSON text (labels_cpu.cpp; host only: the response is built on
// the host, on the service's event loop, so no OpenMP). out receives "[l0,l1,...]", the compact
// text json.dumps gives for the uint8 labels' values, and *written its length; capacity must be
// at least 4 * n + 2 (kStatusBadArgument otherwise).
LS_API int ls_labels_json_cpu(const uint8_t* labels, int64_t n, uint8_t* out, int64_t capacity,
                              int64_t* written);
