// The voxels of the runs' keys in order (app/inference/voxelize.py, after the keys pass of
// voxel_keys_cpu.cpp and Open3D's hash set): each run's cell marked in bitmaps of the 8^3 parts
// of the blocks the hash set gives slots (whose set bits also number the distinct keys), the
// bitmaps' rows of 8 x 8 cells that hold voxels radix-sorted and the distinct keys read off them
// in order, every run given its voxel. Host only, as the keys pass.
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "api.h"
#include "cpu_common.h"
#include "radix_sort.h"
#include "voxel_keys.h"

using namespace lidarseg;
using namespace lidarseg::voxel;

namespace {

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

// A part's key: the key with its cell's place in the part cleared (the low kSubShift bits of each
// axis), so ascending part keys are ascending parts (batch, px, py, pz).
constexpr int64_t kInPart = ((int64_t(1) << kSubShift) - 1) *
                            (1 | int64_t(1) << kAxisBits | int64_t(1) << (2 * kAxisBits));
inline int64_t part_key(int64_t key) { return key & ~kInPart; }

// Each run's cell among the bitmaps (its bitmap * 512 + its cell in it), and per bitmap the key
// of its 8^3 part; seen: the bitmaps, side by side. Two passes over the runs: the first marks
// each slot's parts (and checks the runs), a prefix of their counts places every part's bitmap,
// the second marks the cells. false for a slot or block run out of range or a negative key.
bool mark_cells(const int64_t* run_keys, int64_t runs, const int32_t* block_run,
                const int32_t* slot, int64_t block_runs, int64_t num_slots, int64_t shift,
                std::vector<uint64_t>& seen, int64_t* bit_of_run,
                std::vector<int64_t>& part_of_bitmap) {
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
  part_of_bitmap.resize(bitmaps);
  for (int64_t r = 0; r < runs; ++r) {
    const int64_t part = place.part(run_keys[r]);
    const int64_t w = slot[block_run[r]] * place.mask_words + (part >> 6);
    const uint64_t below = parts[w] & ((uint64_t(1) << (part & 63)) - 1);
    const int64_t bitmap = first_bitmap[w] + __builtin_popcountll(below);
    const int64_t bit = bitmap * kSubCells + CellPlace::cell(run_keys[r]);
    seen[bit >> 6] |= uint64_t(1) << (bit & 63);
    bit_of_run[r] = bit;
    part_of_bitmap[bitmap] = part_key(run_keys[r]);  // checked against every run's at the end
  }
  return true;
}

// The words' sort keys, packed tightly: each field of their parts (batch, px, py, pz) less its
// lowest value, in as few bits as its span needs, and the word's lx under px (x = 8 px + lx):
// the order of (batch, x, py, pz) in fewer radix passes (a KITTI frame's words: 24 bits, not 51).
struct WordKeys {
  int64_t low[4];
  int shift[4];
  int bits = 0;
  explicit WordKeys(const std::vector<int64_t>& parts) {
    int64_t high[4];
    for (int f = 0; f < 4; ++f) {
      low[f] = INT64_MAX, high[f] = INT64_MIN;
      for (const int64_t part : parts) {
        low[f] = std::min(low[f], field(part, f));
        high[f] = std::max(high[f], field(part, f));
      }
    }
    for (int f = 3; f >= 0; --f) {
      shift[f] = bits;
      bits += (parts.empty() ? 0 : bit_length(high[f] - low[f])) + (f == 1 ? kSubShift : 0);
    }
  }
  // batch, px, py or pz of a part's key
  static int64_t field(int64_t part, int f) {
    return f == 0 ? key_field(part, 0) : key_field(part, f) >> kSubShift;
  }
  uint64_t operator()(int64_t part, int64_t lx) const {
    uint64_t key = uint64_t(field(part, 0) - low[0]) << shift[0];
    key |= (uint64_t(field(part, 1) - low[1]) << kSubShift | uint64_t(lx)) << shift[1];
    return key | uint64_t(field(part, 2) - low[2]) << shift[2] | uint64_t(field(part, 3) - low[3]);
  }
};

// The distinct keys in ascending (batch, x, y, z) order, read off the bitmaps instead of sorted.
// Word lx of a part's bitmap is a row of 8 x 8 cells: the plane x = 8 px + lx of the part, bit
// 8 ly + lz. Only the words with cells are sorted, by (batch, x, py, pz) (a KITTI frame's 60,152
// keys lie in 20,479 of them, in 5,925 parts); in that order a lone word of its (batch, x, py)
// gives its cells in bit order, and a run of words of one (batch, x, py) gives them row by row
// (ly), word by word (pz).

// The indices in seen of the words with cells, sorted by their keys: each an Item made by
// make(key, index), sorted on digit(item, shift), its index back by index_of(item).
template <typename Item, typename Make, typename Digit, typename IndexOf>
std::vector<int64_t> sort_words(const std::vector<uint64_t>& seen,
                                const std::vector<int64_t>& part_of_bitmap, const WordKeys& keys,
                                Make make, Digit digit, IndexOf index_of) {
  std::unique_ptr<Item[]> items = uninitialized<Item>(seen.size());
  int64_t n = 0;
  for (size_t w = 0; w < seen.size(); ++w) {
    if (seen[w]) items[n++] = make(keys(part_of_bitmap[w / kSubWords], w % kSubWords), w);
  }
  radix_sort(items, n, keys.bits, digit);
  std::vector<int64_t> order(n);
  for (int64_t i = 0; i < n; ++i) order[i] = index_of(items[i]);
  return order;
}

// The indices in seen of the words with cells, in that order: each word's key and index travel
// as one 64-bit item where they fit together (always, but for batches of thousands of frames).
std::vector<int64_t> words_in_order(const std::vector<uint64_t>& seen,
                                    const std::vector<int64_t>& part_of_bitmap) {
  const WordKeys keys(part_of_bitmap);
  const int index_bits = std::max(bit_length(seen.size()), 1);
  if (keys.bits + index_bits <= 64) {
    const uint64_t index_mask = (uint64_t(1) << index_bits) - 1;
    return sort_words<uint64_t>(
        seen, part_of_bitmap, keys, [=](uint64_t key, uint64_t w) { return key << index_bits | w; },
        [=](uint64_t item, int shift) { return item >> (index_bits + shift); },
        [=](uint64_t item) { return (int64_t)(item & index_mask); });
  }
  struct Keyed {
    uint64_t key;
    int64_t index;
  };
  return sort_words<Keyed>(
      seen, part_of_bitmap, keys, [](uint64_t key, uint64_t w) { return Keyed{key, (int64_t)w}; },
      [](const Keyed& item, int shift) { return item.key >> shift; },
      [](const Keyed& item) { return item.index; });
}

// The end of the words of one (batch, x, py) that starts at words[e] (its part's batch, px, py
// and its lx), at most b.
inline int64_t next_row(const int64_t* words, int64_t e, int64_t b,
                        const int64_t* part_of_bitmap) {
  const auto row_key = [&](int64_t w) {
    return (part_of_bitmap[w / kSubWords] >> kAxisBits) << kSubShift | w % kSubWords;
  };
  const int64_t key = row_key(words[e]);
  int64_t f = e + 1;
  while (f < b && row_key(words[f]) == key) ++f;
  return f;
}

// The cells of words[a, b) (their indices in seen, in order), from row `rows` on: their
// coordinates (origin added), and every cell's row left at its bit's place among all set bits
// (row_of_place), for the runs to find. [a, b) starts and ends at a change of (batch, x, py).
void read_in_order(const int64_t* words, int64_t a, int64_t b, const uint64_t* seen,
                   const int64_t* part_of_bitmap, const int32_t* below, const int32_t* origin,
                   int32_t rows, int32_t* coords, int32_t* row_of_place) {
  const auto cells = [&](int64_t w, uint64_t mask) {  // word w's cells under mask, in bit order
    const uint64_t word = seen[w];
    const int64_t part = part_of_bitmap[w / kSubWords];
    const int32_t batch = (int32_t)key_field(part, 0);
    const int32_t x = (int32_t)(key_field(part, 1) | w % kSubWords) + origin[0];
    const int32_t y = (int32_t)key_field(part, 2) + origin[1];
    const int32_t z = (int32_t)key_field(part, 3) + origin[2];
    // the cells under mask have consecutive places, from the count of the word's cells below
    const uint64_t under = (mask & (~mask + 1)) - 1;  // the bits below mask's lowest
    int32_t place = below[w] + __builtin_popcountll(word & under);
    for (uint64_t bits = word & mask; bits; bits &= bits - 1) {
      const int bit = __builtin_ctzll(bits);
      row_of_place[place++] = rows;
      int32_t* c = coords + 4 * (int64_t)rows++;
      c[0] = batch, c[1] = x, c[2] = y + (bit >> 3), c[3] = z + (bit & 7);
    }
  };
  for (int64_t e = a, f; e < b; e = f) {
    f = next_row(words, e, b, part_of_bitmap);
    if (f == e + 1) {
      cells(words[e], ~uint64_t(0));
      continue;
    }
    for (int ly = 0; ly < 8; ++ly) {
      for (int64_t g = e; g < f; ++g) cells(words[g], uint64_t(0xff) << (8 * ly));
    }
  }
}

// All the words' cells in order, the words split among the threads at changes of (batch, x, py)
// (from 8,192 words: a KITTI frame's 20,479 in 0.5 against 0.9 ms on one Zen 1 core); each
// thread's first row is the count of the cells before its words.
void read_all_in_order(const std::vector<int64_t>& words, const uint64_t* seen,
                       const int64_t* part_of_bitmap, const int32_t* below, const int32_t* origin,
                       int32_t* coords, int32_t* row_of_place) {
  constexpr int64_t kParallelWords = 8192;
  const int64_t n = (int64_t)words.size();
  const int parts = n >= kParallelWords ? std::max(omp_get_max_threads(), 1) : 1;
  std::vector<int64_t> start(parts + 1, n);
  start[0] = 0;
  for (int t = 1; t < parts; ++t) {
    const int64_t at = std::max(n * t / parts, start[t - 1]);
    start[t] = at == 0 || at >= n ? at : next_row(words.data(), at - 1, n, part_of_bitmap);
  }
  std::vector<int32_t> first_row(parts + 1, 0);
  for (int t = 0; t < parts; ++t) {
    int32_t cells = 0;
    for (int64_t e = start[t]; e < start[t + 1]; ++e) cells += __builtin_popcountll(seen[words[e]]);
    first_row[t + 1] = first_row[t] + cells;
  }
#pragma omp parallel for schedule(static) num_threads(parts) if (parts > 1)
  for (int t = 0; t < parts; ++t) {
    read_in_order(words.data(), start[t], start[t + 1], seen, part_of_bitmap, below, origin,
                  first_row[t], coords, row_of_place);
  }
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
  // Each key's cell: bitmaps of the cells of each block's slot.
  std::vector<uint64_t> seen;
  std::vector<int64_t> part_of_bitmap;
  std::unique_ptr<int64_t[]> bit_of_run = uninitialized<int64_t>(runs);
  if (!mark_cells(run_keys, runs, block_run, slot, block_runs, num_slots, shift, seen,
                  bit_of_run.get(), part_of_bitmap)) {
    return kStatusBadArgument;
  }
  // A set bit's place among all set bits (the bits below it: the words' popcounts) numbers the
  // distinct keys.
  std::vector<int32_t> below(seen.size() + 1, 0);
  for (size_t w = 0; w < seen.size(); ++w) {
    below[w + 1] = below[w] + __builtin_popcountll(seen[w]);
  }
  const int64_t m = below[seen.size()];
  std::unique_ptr<int32_t[]> row_of_place = uninitialized<int32_t>(m);
  read_all_in_order(words_in_order(seen, part_of_bitmap), seen.data(), part_of_bitmap.data(),
                    below.data(), origin, coords, row_of_place.get());
  // Every run's row: the row its bit's place holds. Two blocks given one slot would merge their
  // cells where they share a bitmap: a run whose part is not its bitmap's.
  int merged = 0;
#pragma omp parallel for schedule(static) reduction(| : merged) if (runs >= kParallelRows)
  for (int64_t r = 0; r < runs; ++r) {
    const int64_t bit = bit_of_run[r];
    const uint64_t lower = seen[bit >> 6] & ((uint64_t(1) << (bit & 63)) - 1);
    voxel_of_run[r] = row_of_place[below[bit >> 6] + __builtin_popcountll(lower)];
    merged |= part_of_bitmap[bit / kSubCells] != part_key(run_keys[r]);
  }
  if (merged) return kStatusBadArgument;
  *num_voxels = m;
  return kStatusOk;
}
