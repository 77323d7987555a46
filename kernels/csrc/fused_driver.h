// The walk shared by the fused CPU convolutions (fused_cpu.cpp in fp32, fused_bf16_cpu.cpp with
// bf16 inputs and weights): which thread computes which output rows, in which order the offsets
// add into them, and the per-block epilogue. Only the tile arithmetic differs between them, and
// it comes in as `Entries` (see run_fused below).
//
// Each output row is computed by one thread, offsets added in kernel_order (after the identity
// offset, which stores rather than adds): bitwise reproducible for any thread count. Rows are
// walked in blocks that stay in L2 (kBlockBytes of output rows), every offset in turn per block:
// a row is read and written back from L2 by all its offsets instead of once per offset pass over
// the whole output, and on sorted coordinates the inputs of a block are a band of nearby rows as
// well. Blocks are handed out to threads dynamically, so a thread that the OS (or another process
// on a shared machine) holds up does not hold up the others at the end of the region.
#pragma once
#include <omp.h>
#include <stdint.h>

#include <vector>

#include "cpu_common.h"

namespace lidarseg {

constexpr int64_t kFusedParallelWork = 1 << 18;  // multiply-adds below which one thread is faster
constexpr int64_t kFusedBlockBytes = 256 << 10;  // output rows per block: this many bytes of them

// Rows [0, n) of out (cout wide) += bias and += the same rows of residual (each when given),
// then max(0, .) when relu: per block while its rows are still in L2.
inline void fused_epilogue(const float* bias, const float* residual, bool relu, int64_t cout,
                           float* out, int64_t n) {
  typedef float v8 __attribute__((vector_size(32)));
  for (int64_t r = 0; r < n; ++r) {
    float* row = out + r * cout;
    const float* res = residual == nullptr ? nullptr : residual + r * cout;
    int64_t c = 0;
    for (; c + 8 <= cout; c += 8) {
      v8 v, t;
      __builtin_memcpy(&v, row + c, sizeof(v));
      if (bias != nullptr) {
        __builtin_memcpy(&t, bias + c, sizeof(t));
        v += t;
      }
      if (res != nullptr) {
        __builtin_memcpy(&t, res + c, sizeof(t));
        v += t;
      }
      if (relu) v = v > 0 ? v : v8{};
      __builtin_memcpy(row + c, &v, sizeof(v));
    }
    for (; c < cout; ++c) {
      float v = row[c] + (bias != nullptr ? bias[c] : 0.0f) + (res != nullptr ? res[c] : 0.0f);
      row[c] = relu && !(v > 0) ? 0.0f : v;
    }
  }
}

// Asks for the input rows (row_bytes each, of x) and the output rows (cout floats each, of out)
// of map entries [from, to): the next tile's, scattered over both matrices, so that their cache
// misses overlap this tile's arithmetic. Every fused kernel's tile loop calls it.
__attribute__((always_inline)) inline void prefetch_entries(const void* x, int64_t row_bytes,
                                                            const float* out, int64_t cout,
                                                            const int32_t* in,
                                                            const int32_t* out_rows,
                                                            int64_t from, int64_t to) {
  for (int64_t e = from; e < to; ++e) {
    const char* src_row = static_cast<const char*>(x) + (int64_t)in[e] * row_bytes;
    const char* dst_row = reinterpret_cast<const char*>(out + (int64_t)out_rows[e] * cout);
    for (int64_t b = 0; b < row_bytes; b += 64) __builtin_prefetch(src_row + b);
    const int64_t dst_bytes = cout * (int64_t)sizeof(float);
    for (int64_t b = 0; b < dst_bytes; b += 64) __builtin_prefetch(dst_row + b, 1);
  }
}

// What the identity offset's store adds to its products: the bias and the same output row of
// residual (either may be null). Folded into the store, while the row is in registers, they
// leave the pass after a block only the ReLU, where it had read each row and its residual row.
struct StoreAddend {
  const float* bias;      // [cout]
  const float* residual;  // [num_out, cout], indexed by output row
};

struct NoBlockHook {
  bool takes_relu() const { return false; }
  void operator()(int64_t, int64_t, bool, float*) const {}
};

// entries(kStore, w_k, in, out_rows, m, out, add): rows in[0..m) of x times offset weight w_k,
// stored into (kStore, plus add's terms) or added to the out rows out_rows[0..m).
// w_k = w + k * w_stride. after_block(first, end, relu, rows), when given, runs once the out rows
// [first, end) are final (row r at rows + r * cout), on the thread that computed them, while
// they are still in cache; where after_block.takes_relu() it is handed the ReLU of a submanifold
// conv (relu = true: it applies it before its own reading of the rows, one pass over them
// instead of two).
//
// out == nullptr: the rows are made block by block in a buffer of the thread's own, reused for
// each of its blocks (in L2), and after_block is all that sees them: a conv whose fp32 output
// nothing reads but the hook (the int8 conv that quantizes its ReLU output for the next conv)
// never writes it to memory. Each block's rows keep their row numbers: the buffer is addressed
// as `out` would be over [block, end).
template <typename W, typename Entries, typename AfterBlock = NoBlockHook>
void run_fused(const W* w, int64_t w_stride, int64_t cin, int64_t cout, const int32_t* in_idx,
               const int32_t* out_idx, const int64_t* bounds, const int32_t* kernel_order,
               int64_t num_kernels, int32_t identity, const float* bias, const float* residual,
               int32_t relu, int64_t num_out, float* out, Entries entries,
               AfterBlock after_block = AfterBlock{}) {
  int64_t total = identity >= 0 ? num_out : 0;
  for (int64_t j = 0; j < num_kernels; ++j) {
    const int32_t k = kernel_order[j];
    total += bounds[k + 1] - bounds[k];
  }
  const int64_t fit = kFusedBlockBytes / (cout * (int64_t)sizeof(float));
  const int64_t block_rows = fit > 16 ? fit : 16;
  const int64_t num_blocks = (num_out + block_rows - 1) / block_rows;
  const bool hook_relu = identity >= 0 && relu && after_block.takes_relu();
#pragma omp parallel if (total * cin * cout >= kFusedParallelWork && num_blocks > 1)
  {
    // Per offset, where this thread's last block ended in its entries (sorted by output row, so
    // a block's are one run): a thread's blocks ascend, so its next block's run starts a short
    // gallop further on. No table shared between threads, and so no barrier to wait at for a
    // thread that is still waking up.
    // (monotonic: OpenMP 5 lets a plain dynamic schedule hand a thread a lower block later; a
    // cursor past the block is reset all the same.)
    std::vector<int64_t> cursor(num_kernels);
    int64_t cursor_row = num_out + 1;  // rows below this one: the cursors must start over
    std::vector<int32_t> rows(block_rows);
    std::vector<float> own(out == nullptr ? block_rows * cout : 0);
#pragma omp for schedule(monotonic : dynamic, 1)
    for (int64_t b = 0; b < num_blocks; ++b) {
      const int64_t block = b * block_rows;
      const int64_t end = block + block_rows < num_out ? block + block_rows : num_out;
      if (block < cursor_row) {
        for (int64_t j = 0; j < num_kernels; ++j) cursor[j] = bounds[kernel_order[j]];
      }
      cursor_row = end;
      // where row r of this block is made: base + r * cout (the thread's buffer, shifted by the
      // block's first row, when there is no out)
      float* const base = out != nullptr ? out
                                         : reinterpret_cast<float*>(
                                               reinterpret_cast<uintptr_t>(own.data()) -
                                               (uintptr_t)(block * cout * sizeof(float)));
      if (identity >= 0) {  // in = out = every row of the block
        for (int64_t r = block; r < end; ++r) rows[r - block] = (int32_t)r;
        entries(true, w + (int64_t)identity * w_stride, rows.data(), rows.data(), end - block,
                base, StoreAddend{bias, residual});
      } else {  // the offsets add into zeros, cleared here while the block is in cache
        __builtin_memset(base + block * cout, 0, (end - block) * cout * sizeof(float));
      }
      for (int64_t j = 0; j < num_kernels; ++j) {
        const int32_t k = kernel_order[j];
        const int64_t first = gallop_lower_bound(out_idx, cursor[j], bounds[k + 1], block);
        // a scan's entries spread about evenly over the output rows: the block's share of
        // this offset's entries is where its run ends, near enough for a short search
        const int64_t share = (bounds[k + 1] - bounds[k]) * (end - block) / num_out;
        const int64_t last = lower_bound_near(out_idx, first, bounds[k + 1], first + share, end);
        cursor[j] = last;
        if (last > first) {
          entries(false, w + (int64_t)k * w_stride, in_idx + first, out_idx + first,
                  last - first, base, StoreAddend{nullptr, nullptr});
        }
      }
      if (identity >= 0 && relu && !hook_relu) {  // bias, residual: in the identity's store
        fused_epilogue(nullptr, nullptr, true, cout, base + block * cout, end - block);
      } else if (identity < 0 && (bias != nullptr || residual != nullptr || relu)) {
        fused_epilogue(bias, residual == nullptr ? nullptr : residual + block * cout, relu != 0,
                       cout, base + block * cout, end - block);
      }
      after_block(block, end, hook_relu, base);
    }
  }
}

}  // namespace lidarseg
