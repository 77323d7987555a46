// The voxels of the runs' keys in order (app/inference/voxelize.py, after the keys pass of
// voxel_keys_cpu.cpp and Open3D's hash set): the first run of each key from the slots the hash
// set gives the runs' blocks (a bitmap per block, whose set bits also number the distinct keys),
// and the distinct keys radix-sorted, every run given its voxel. Host only, as the keys pass.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "api.h"
#include "cpu_common.h"
#include "voxel_keys.h"

using namespace lidarseg;
using namespace lidarseg::voxel;

namespace {

// n PODs left uninitialized (std::vector would zero them first): for arrays whose every element
// is written before it is read.
template <typename T>
std::unique_ptr<T[]> uninitialized(size_t n) {
  return std::unique_ptr<T[]>(new T[n]);
}

// LSD radix sort of items by digit(item, shift) over `bits` bits, in as few passes of at most
// 11-bit digits (a histogram that stays in L1) as they need; stable. All the passes' histograms
// come from one read of the items.
template <typename Item, typename Digit>
void radix_sort(std::unique_ptr<Item[]>& items, int64_t n, int bits, Digit digit) {
  constexpr int kMaxDigitBits = 11;
  const int passes = (bits + kMaxDigitBits - 1) / kMaxDigitBits;
  if (passes == 0) return;
  const int digit_bits = (bits + passes - 1) / passes;
  const uint64_t mask = (uint64_t(1) << digit_bits) - 1;
  const size_t buckets = size_t(1) << digit_bits;
  std::vector<int64_t> count(passes * buckets, 0);
  for (int64_t i = 0; i < n; ++i) {
    for (int p = 0; p < passes; ++p) {
      ++count[p * buckets + (digit(items[i], p * digit_bits) & mask)];
    }
  }
  std::unique_ptr<Item[]> other = uninitialized<Item>(n);
  for (int p = 0; p < passes; ++p) {
    int64_t* c = &count[p * buckets];
    int64_t sum = 0;
    for (size_t b = 0; b < buckets; ++b) {
      const int64_t here = c[b];
      c[b] = sum;
      sum += here;
    }
    for (int64_t i = 0; i < n; ++i) other[c[digit(items[i], p * digit_bits) & mask]++] = items[i];
    items.swap(other);
  }
}

// order[n] such that keys[order] ascends, equal keys in row order. Where a key's bits and a row's
// fit 64 together (a KITTI frame's 60,152 keys of 29 bits and rows of 16; Ouster's 103,075 at
// 0.05 m: 34 and 17), they travel as one word (half the memory traffic of a key and a row).
void radix_argsort(const uint64_t* keys, int64_t n, int bits, int64_t* order) {
  const int row_bits = std::max(bit_length((uint64_t)std::max<int64_t>(n - 1, 0)), 1);
  if (bits + row_bits <= 64) {
    std::unique_ptr<uint64_t[]> items = uninitialized<uint64_t>(n);
    for (int64_t i = 0; i < n; ++i) items[i] = keys[i] << row_bits | uint64_t(i);
    radix_sort(items, n, bits,
               [row_bits](uint64_t item, int shift) { return item >> (row_bits + shift); });
    const uint64_t row_mask = (uint64_t(1) << row_bits) - 1;
    for (int64_t i = 0; i < n; ++i) order[i] = (int64_t)(items[i] & row_mask);
    return;
  }
  struct Keyed {
    uint64_t key;
    int64_t row;
  };
  std::unique_ptr<Keyed[]> items = uninitialized<Keyed>(n);
  for (int64_t i = 0; i < n; ++i) items[i] = {keys[i], i};
  radix_sort(items, n, bits, [](const Keyed& item, int shift) { return item.key >> shift; });
  for (int64_t i = 0; i < n; ++i) order[i] = items[i].row;
}

// How keys are re-packed tightly: each field minus its lowest value in as few bits as its span
// needs (same order, fewer radix passes: a KITTI frame at 0.1 m needs 29 bits, not 51).
struct TightPacking {
  int64_t low[4];
  int32_t width[4];
  int bits;
};

// The tight packing of keys (their fields' spans) and the keys packed with it: straight loops
// over the fields (no per-field loop or range check: every key is inside the spans), which the
// compiler vectorizes.
TightPacking tight_keys(const int64_t* keys, size_t n, uint64_t* packed) {
  TightPacking t;
  int64_t high[4];
  for (int f = 0; f < 4; ++f) {
    int64_t lo = INT64_MAX, hi = INT64_MIN;
    for (size_t i = 0; i < n; ++i) {
      const int64_t v = key_field(keys[i], f);
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
    t.low[f] = lo, high[f] = hi;
  }
  t.bits = 0;
  int shift[4];
  for (int f = 3; f >= 0; --f) {
    t.width[f] = n == 0 ? 0 : bit_length(high[f] - t.low[f]);
    shift[f] = t.bits;
    t.bits += t.width[f];
  }
  for (size_t i = 0; i < n; ++i) {
    uint64_t p = 0;
    for (int f = 0; f < 4; ++f) p |= uint64_t(key_field(keys[i], f) - t.low[f]) << shift[f];
    packed[i] = p;
  }
  return t;
}

// A block's cells in bitmaps of 8^3 cells (64 bytes), one for each 8^3 part of the block that
// has voxels: a block of 16^3, 32^3 or 64^3 cells takes only those (at most 64 bytes a run),
// found by a mask of its parts (8 bytes a block; 64 for 64^3).
constexpr int64_t kSubShift = 3, kMaxShift = 6, kSubCells = int64_t(1) << (3 * kSubShift);
constexpr int64_t kSubWords = kSubCells / 64;

// Where a key's cell lies in its block of 2^shift cells per axis: its 8^3 part (bits of the
// part mask, mask_words words of it a block) and its cell in that part's bitmap.
struct CellPlace {
  int64_t sub_bits, cell_mask, mask_words;
  explicit CellPlace(int64_t shift)
      : sub_bits(shift - kSubShift),
        cell_mask((int64_t(1) << shift) - 1),
        mask_words(std::max<int64_t>((int64_t(1) << (3 * sub_bits)) / 64, 1)) {}
  int64_t part(int64_t key) const {
    const int64_t x = (key_field(key, 1) & cell_mask) >> kSubShift;
    const int64_t y = (key_field(key, 2) & cell_mask) >> kSubShift;
    return ((x << sub_bits | y) << sub_bits) | (key_field(key, 3) & cell_mask) >> kSubShift;
  }
  static int64_t cell(int64_t key) {
    constexpr int64_t low = (1 << kSubShift) - 1;
    return ((key_field(key, 1) & low) << kSubShift | (key_field(key, 2) & low)) << kSubShift |
           (key_field(key, 3) & low);
  }
};

// Each run's cell among the bitmaps (its bitmap * 512 + its cell in it), made a first run's as
// ~bit (negative), and the keys of the first runs in run order (*firsts of them); seen: the
// bitmaps, side by side. Two passes over the runs: the first marks each slot's parts (and checks
// the runs), a prefix of their counts places every part's bitmap, the second marks the cells.
// false for a slot or block run out of range or a negative key.
bool mark_cells(const int64_t* run_keys, int64_t runs, const int32_t* block_run,
                const int32_t* slot, int64_t block_runs, int64_t num_slots, int64_t shift,
                std::vector<uint64_t>& seen, int64_t* bit_of_run, int64_t* distinct,
                int64_t* firsts) {
  int64_t used = 0;  // slots 0 .. used - 1 are indexed: a hash set's slots are a dense prefix
  for (int64_t b = 0; b < block_runs; ++b) {
    if (slot[b] < 0 || slot[b] >= num_slots) return false;
    used = std::max(used, (int64_t)slot[b] + 1);
  }
  const CellPlace place(shift);
  // per slot, mask_words words: which of its parts have voxels
  std::vector<uint64_t> parts(used * place.mask_words, 0);
  for (int64_t r = 0; r < runs; ++r) {
    if (block_run[r] < 0 || block_run[r] >= block_runs || run_keys[r] < 0) return false;
    const int64_t part = place.part(run_keys[r]);
    parts[slot[block_run[r]] * place.mask_words + (part >> 6)] |= uint64_t(1) << (part & 63);
  }
  std::vector<int64_t> first_bitmap(parts.size());  // per mask word: its first part's bitmap
  int64_t bitmaps = 0;
  for (size_t w = 0; w < parts.size(); ++w) {
    first_bitmap[w] = bitmaps;
    bitmaps += __builtin_popcountll(parts[w]);
  }
  seen.assign(bitmaps * kSubWords, 0);
  int64_t m = 0;
  for (int64_t r = 0; r < runs; ++r) {
    const int64_t part = place.part(run_keys[r]);
    const int64_t w = slot[block_run[r]] * place.mask_words + (part >> 6);
    const uint64_t below = parts[w] & ((uint64_t(1) << (part & 63)) - 1);
    const int64_t bitmap = first_bitmap[w] + __builtin_popcountll(below);
    const int64_t bit = bitmap * kSubCells + CellPlace::cell(run_keys[r]);
    uint64_t& word = seen[bit >> 6];
    const uint64_t mask = uint64_t(1) << (bit & 63);
    const bool first = !(word & mask);
    word |= mask;
    bit_of_run[r] = first ? ~bit : bit;
    distinct[m] = run_keys[r];  // kept where first
    m += first;
  }
  *firsts = m;
  return true;
}

}  // namespace

LS_API int ls_voxel_order_cpu(const int64_t* run_keys, int64_t runs, const int32_t* block_run,
                              const int32_t* slot, int64_t block_runs, int64_t num_slots,
                              int64_t shift, const int32_t* origin, int32_t* voxel_of_run,
                              int32_t* coords, int64_t* num_voxels) {
  if (runs < 0 || runs > INT32_MAX || block_runs < 0 || num_slots < 0 ||
      shift < kSubShift || shift > kMaxShift) {
    return kStatusBadArgument;
  }
  // The first run of each key: bitmaps of the cells of each block's slot.
  std::vector<uint64_t> seen;
  std::unique_ptr<int64_t[]> bit_of_run = uninitialized<int64_t>(runs);
  std::unique_ptr<int64_t[]> distinct = uninitialized<int64_t>(runs + 1);
  int64_t m = 0;
  if (!mark_cells(run_keys, runs, block_run, slot, block_runs, num_slots, shift, seen,
                  bit_of_run.get(), distinct.get(), &m)) {
    return kStatusBadArgument;
  }
  // The distinct keys in order: rank[d] is the row of the d-th first run's key.
  std::unique_ptr<uint64_t[]> packed = uninitialized<uint64_t>(m);
  const TightPacking tight = tight_keys(distinct.get(), m, packed.get());
  std::unique_ptr<int64_t[]> order = uninitialized<int64_t>(m), rank = uninitialized<int64_t>(m);
  std::unique_ptr<int64_t[]> sorted = uninitialized<int64_t>(m);
  radix_argsort(packed.get(), m, tight.bits, order.get());
  const int64_t axis_mask = kAxisCells - 1;
  for (int64_t v = 0; v < m; ++v) {
    const int64_t key = sorted[v] = distinct[order[v]];
    rank[order[v]] = v;
    int32_t* c = coords + 4 * v;
    c[0] = (int32_t)(key >> kBatchShift);
    c[1] = (int32_t)((key >> (2 * kAxisBits)) & axis_mask) + origin[0];
    c[2] = (int32_t)((key >> kAxisBits) & axis_mask) + origin[1];
    c[3] = (int32_t)(key & axis_mask) + origin[2];
  }
  // A set bit's place among all set bits (the bits below it: the words' popcounts) numbers the
  // distinct keys; the first run of each leaves its row there for the repeats that follow.
  std::vector<int32_t> below(seen.size() + 1, 0);
  for (size_t w = 0; w < seen.size(); ++w) {
    below[w + 1] = below[w] + __builtin_popcountll(seen[w]);
  }
  std::unique_ptr<int64_t[]> row_of_place = uninitialized<int64_t>(m);
  for (int64_t r = 0, d = 0; r < runs; ++r) {
    const bool first = bit_of_run[r] < 0;
    const int64_t bit = first ? ~bit_of_run[r] : bit_of_run[r];
    const uint64_t lower = seen[bit >> 6] & ((uint64_t(1) << (bit & 63)) - 1);
    const int64_t place = below[bit >> 6] + __builtin_popcountll(lower);
    if (first) row_of_place[place] = rank[d++];
    const int64_t row = row_of_place[place];
    // two blocks given one slot would merge their cells: a repeat of another key
    if (sorted[row] != run_keys[r]) return kStatusBadArgument;
    voxel_of_run[r] = (int32_t)row;
  }
  *num_voxels = m;
  return kStatusOk;
}
