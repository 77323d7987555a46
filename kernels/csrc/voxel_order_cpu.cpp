// The voxels of the runs' keys in order (app/inference/voxelize.py, after voxel_cpu.cpp's keys
// pass): the key of each run's block for Open3D's hash set, the first run of each key from the
// slots it gives (a bitmap per block), and the distinct keys radix-sorted, every run given its
// voxel. Host only, as voxel_cpu.cpp.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "api.h"
#include "cpu_common.h"
#include "voxel_keys.h"

using namespace lidarseg;
using namespace lidarseg::voxel;

namespace {

// LSD radix sort of items by digit(item, shift) over `bits` bits, in as few passes of at most
// 11-bit digits (a histogram that stays in L1) as they need; stable. All the passes' histograms
// come from one read of the items.
template <typename Item, typename Digit>
void radix_sort(std::vector<Item>& items, int bits, Digit digit) {
  constexpr int kMaxDigitBits = 11;
  const int passes = (bits + kMaxDigitBits - 1) / kMaxDigitBits;
  if (passes == 0) return;
  const int digit_bits = (bits + passes - 1) / passes;
  const uint64_t mask = (uint64_t(1) << digit_bits) - 1;
  const size_t buckets = size_t(1) << digit_bits;
  std::vector<int64_t> count(passes * buckets, 0);
  for (const Item& item : items) {
    for (int p = 0; p < passes; ++p) ++count[p * buckets + (digit(item, p * digit_bits) & mask)];
  }
  std::vector<Item> other(items.size());
  for (int p = 0; p < passes; ++p) {
    int64_t* c = &count[p * buckets];
    int64_t sum = 0;
    for (size_t b = 0; b < buckets; ++b) {
      const int64_t here = c[b];
      c[b] = sum;
      sum += here;
    }
    for (const Item& item : items) other[c[digit(item, p * digit_bits) & mask]++] = item;
    items.swap(other);
  }
}

// order[n] such that keys[order] ascends, equal keys in row order. Keys of at most 32 bits travel
// with their row in one 64-bit word (half the memory traffic of a key and a row).
void radix_argsort(const uint64_t* keys, int64_t n, int bits, int64_t* order) {
  if (bits <= 32 && n <= (int64_t(1) << 32)) {
    std::vector<uint64_t> items(n);
    for (int64_t i = 0; i < n; ++i) items[i] = keys[i] << 32 | uint64_t(i);
    radix_sort(items, bits, [](uint64_t item, int shift) { return item >> (32 + shift); });
    for (int64_t i = 0; i < n; ++i) order[i] = (int64_t)(items[i] & 0xffffffffu);
    return;
  }
  struct Keyed {
    uint64_t key;
    int64_t row;
  };
  std::vector<Keyed> items(n);
  for (int64_t i = 0; i < n; ++i) items[i] = {keys[i], i};
  radix_sort(items, bits, [](const Keyed& item, int shift) { return item.key >> shift; });
  for (int64_t i = 0; i < n; ++i) order[i] = items[i].row;
}

// How keys are re-packed tightly: each field minus its lowest value in as few bits as its span
// needs (same order, fewer radix passes: a KITTI frame at 0.1 m needs 29 bits, not 51).
struct TightPacking {
  int64_t low[4];
  int32_t width[4];
  int bits;
};

// The tight packing of keys (their fields' spans) and the keys packed with it.
TightPacking tight_keys(const std::vector<int64_t>& keys, std::vector<uint64_t>& packed) {
  TightPacking t;
  int64_t high[4];
  for (int f = 0; f < 4; ++f) t.low[f] = INT64_MAX, high[f] = INT64_MIN;
  for (const int64_t key : keys) {
    for (int f = 0; f < 4; ++f) {
      t.low[f] = std::min(t.low[f], key_field(key, f));
      high[f] = std::max(high[f], key_field(key, f));
    }
  }
  t.bits = 0;
  for (int f = 0; f < 4; ++f) {
    t.width[f] = keys.empty() ? 0 : bit_length(high[f] - t.low[f]);
    t.bits += t.width[f];
  }
  packed.resize(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) pack_fields(keys[i], 0, t.low, t.width, &packed[i]);
  return t;
}

// Where each leading digit's keys start among ascending packed keys: start[d] = the first
// position whose top `digit_bits` bits (of `bits`) are >= d, start[2^digit_bits] = n. A search
// for a key then looks only among the keys of its leading digit (one or two on average).
std::vector<int64_t> digit_starts(const std::vector<uint64_t>& sorted, int bits, int digit_bits) {
  const size_t digits = size_t(1) << digit_bits;
  std::vector<int64_t> start(digits + 1);
  size_t d = 0;
  for (size_t v = 0; v < sorted.size(); ++v) {
    const size_t top = (size_t)(sorted[v] >> (bits - digit_bits));
    while (d <= top) start[d++] = (int64_t)v;
  }
  while (d <= digits) start[d++] = (int64_t)sorted.size();
  return start;
}

}  // namespace

LS_API int ls_voxel_order_cpu(const int64_t* run_keys, int64_t runs, const uint8_t* first,
                              const int32_t* origin, int64_t num_voxels, int64_t* voxel_of_run,
                              int32_t* coords) {
  if (runs < 0 || num_voxels < 0) return kStatusBadArgument;
  std::vector<int64_t> distinct;
  distinct.reserve(num_voxels);
  for (int64_t r = 0; r < runs; ++r) {
    if (run_keys[r] < 0) return kStatusBadArgument;
    if (!first[r]) continue;
    if ((int64_t)distinct.size() == num_voxels) return kStatusBadArgument;
    distinct.push_back(run_keys[r]);
  }
  if ((int64_t)distinct.size() != num_voxels) return kStatusBadArgument;
  std::vector<uint64_t> packed;
  const TightPacking tight = tight_keys(distinct, packed);
  std::vector<int64_t> order(num_voxels), rank(num_voxels), sorted(num_voxels);
  radix_argsort(packed.data(), num_voxels, tight.bits, order.data());
  std::vector<uint64_t> sorted_packed(num_voxels);
  const int64_t axis_mask = kAxisCells - 1;
  for (int64_t v = 0; v < num_voxels; ++v) {
    const int64_t key = sorted[v] = distinct[order[v]];
    sorted_packed[v] = packed[order[v]];
    if (v > 0 && key == sorted[v - 1]) return kStatusBadArgument;  // a key marked first twice
    rank[order[v]] = v;
    int32_t* c = coords + 4 * v;
    c[0] = (int32_t)(key >> kBatchShift);
    c[1] = (int32_t)((key >> (2 * kAxisBits)) & axis_mask) + origin[0];
    c[2] = (int32_t)((key >> kAxisBits) & axis_mask) + origin[1];
    c[3] = (int32_t)(key & axis_mask) + origin[2];
  }
  // a repeated key: its voxel by binary search among the sorted distinct keys of its leading
  // digit (as many digit bits as the voxel count has, about one key per digit, at most 20: the
  // table then holds at most 8 MiB)
  const int digit_bits =
      std::min({tight.bits, std::max(bit_length((uint64_t)num_voxels), 1), 20});
  const std::vector<int64_t> start = digit_starts(sorted_packed, tight.bits, digit_bits);
  for (int64_t r = 0, d = 0; r < runs; ++r) {
    if (first[r]) {
      voxel_of_run[r] = rank[d++];
      continue;
    }
    uint64_t p;
    if (!pack_fields(run_keys[r], 0, tight.low, tight.width, &p)) {
      return kStatusBadArgument;  // outside every first key's span: no first run
    }
    const size_t top = tight.bits == 0 ? 0 : (size_t)(p >> (tight.bits - digit_bits));
    const auto begin = sorted_packed.begin() + start[top];
    const auto end = sorted_packed.begin() + start[top + 1];
    const auto at = std::lower_bound(begin, end, p);
    if (at == end || *at != p) return kStatusBadArgument;  // no first run
    voxel_of_run[r] = at - sorted_packed.begin();
  }
  return kStatusOk;
}

namespace {

constexpr int kRecentBits = 12;  // 4,096 recent blocks (64 KB): a scan's revisits, in L2
constexpr int64_t kRecentBlocks = int64_t(1) << kRecentBits;

struct RecentBlock {
  uint64_t key;  // packed block key; ~0 (no block packs to it: 63 bits at most) when empty
  int32_t row;   // its row in out
};

}  // namespace

LS_API int ls_block_keys_cpu(const int64_t* run_keys, int64_t runs, int64_t shift,
                             const int64_t* low, const int32_t* widths, int64_t words,
                             int32_t* out, int32_t* block_run, int64_t* count) {
  if (runs < 0 || runs > INT32_MAX || shift < 0 || shift >= kAxisBits || words < 1 ||
      words > 2) {
    return kStatusBadArgument;
  }
  int total = 0;
  for (int f = 0; f < 4; ++f) {
    if (widths[f] < 0 || widths[f] > kAxisBits + 12) return kStatusBadArgument;
    total += widths[f];
  }
  if (total > (words == 1 ? 31 : 63)) return kStatusBadArgument;
  // The blocks given out lately, by a hash of their key: a block seen again soon (the next
  // scan line, the next sector of rings) reuses its key's row instead of sending Open3D one more
  // copy. A miss only costs a duplicate key, which the hash set takes as it always did.
  std::vector<RecentBlock> recent(kRecentBlocks, RecentBlock{~0ull, -1});
  int64_t t = 0;
  uint64_t last = 0;
  int32_t row = -1;  // the key row of the current run of runs in one block
  for (int64_t r = 0; r < runs; ++r) {
    if (run_keys[r] < 0) return kStatusBadArgument;
    uint64_t packed;
    if (!pack_fields(run_keys[r], shift, low, widths, &packed)) return kStatusBadArgument;
    if (row < 0 || packed != last) {  // a new run of blocks: consecutive runs share most blocks
      RecentBlock& seen = recent[(packed * 0x9E3779B97F4A7C15ull) >> (64 - kRecentBits)];
      last = packed;
      if (seen.key == packed) {
        row = seen.row;
        block_run[r] = row;
        continue;
      }
      if (words == 1) {
        out[t] = (int32_t)packed;
      } else {
        out[2 * t] = (int32_t)(uint32_t)packed;
        out[2 * t + 1] = (int32_t)(uint32_t)(packed >> 32);
      }
      row = (int32_t)t++;
      seen = RecentBlock{packed, row};
    }
    block_run[r] = row;
  }
  *count = t;
  return kStatusOk;
}

LS_API int ls_first_in_blocks_cpu(const int64_t* run_keys, int64_t runs, const int32_t* block_run,
                                  const int32_t* slot, int64_t block_runs, int64_t num_slots,
                                  int64_t shift, uint8_t* first) {
  if (runs < 0 || block_runs < 0 || num_slots < 0 || shift < 1 || shift > 4) {
    return kStatusBadArgument;
  }
  int64_t used = 0;  // slots 0 .. used - 1 get a bitmap: a hash set's slots are a dense prefix
  for (int64_t b = 0; b < block_runs; ++b) {
    if (slot[b] < 0 || slot[b] >= num_slots) return kStatusBadArgument;
    used = std::max(used, (int64_t)slot[b] + 1);
  }
  const int64_t cells = int64_t(1) << (3 * shift), words = std::max<int64_t>(cells / 64, 1);
  const int64_t cell_mask = (int64_t(1) << shift) - 1;
  std::vector<uint64_t> seen(used * words, 0);
  for (int64_t r = 0; r < runs; ++r) {
    if (block_run[r] < 0 || block_run[r] >= block_runs || run_keys[r] < 0) {
      return kStatusBadArgument;
    }
    const int64_t x = key_field(run_keys[r], 1) & cell_mask;
    const int64_t y = key_field(run_keys[r], 2) & cell_mask;
    const int64_t z = key_field(run_keys[r], 3) & cell_mask;
    const int64_t cell = (x << shift | y) << shift | z;
    uint64_t& word = seen[slot[block_run[r]] * words + (cell >> 6)];
    const uint64_t bit = uint64_t(1) << (cell & 63);
    first[r] = !(word & bit);
    word |= bit;
  }
  return kStatusOk;
}
