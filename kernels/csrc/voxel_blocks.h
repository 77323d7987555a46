// The block keys of the voxelizer's keys pass (voxel_keys_cpu.cpp), which Open3D's hash set takes
// to find the occupied blocks of voxels: a block key's layout (BlockLayout), and the rows a part
// of the pass gives its block keys, a block seen lately reusing its row (BlockRows, over each
// thread's RecentBlocks). Host only. In an unnamed namespace, as when they lived in that file: the
// one translation unit that includes this header keeps them to itself, none of them exported.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "voxel_keys.h"

namespace lidarseg {
namespace voxel {
namespace {

// The blocks of the keys pass: 2^shift cells per axis, each block's key the batch, then the
// axes' cells >> shift, in widths[0..3] bits (one int32 where they fit 31 bits, else two).
struct BlockLayout {
  int64_t shift, widths[4], words;
  int64_t limit[3];  // cells per axis that a key may take: the blocks' widths bound them
  int64_t batch_key;  // the batch's field of a block key

  // false for a shift or widths the keys cannot have, or a batch beyond its width
  bool set(const int32_t* block, int64_t batch) {
    shift = block[0];
    int64_t bits = 0;
    for (int f = 0; f < 4; ++f) {
      widths[f] = block[1 + f];
      if (widths[f] < 0 || widths[f] > kAxisBits) return false;
      bits += widths[f];
    }
    if (shift < 0 || shift >= kAxisBits || bits > 63 || batch >> widths[0] != 0) return false;
    words = bits <= 31 ? 1 : 2;
    for (int a = 0; a < 3; ++a) limit[a] = std::min(shift + widths[1 + a], int64_t(kAxisBits));
    batch_key = batch << (widths[1] + widths[2] + widths[3]);
    return true;
  }
  uint64_t key_of(int64_t key) const {
    const int64_t x = key_field(key, 1) >> shift, y = key_field(key, 2) >> shift;
    const int64_t z = key_field(key, 3) >> shift;
    return uint64_t(batch_key | x << (widths[2] + widths[3]) | y << widths[3] | z);
  }
};

constexpr int kRecentBits = 12;  // 4,096 recent blocks (64 KB): a scan's revisits, in L2
constexpr int64_t kRecentBlocks = int64_t(1) << kRecentBits;

// A thread's table of recent blocks, kept from call to call (a frame's 64 KB neither allocated
// nor cleared again): each pass numbers itself, and an entry another pass left is empty to it.
struct RecentBlocks {
  struct Entry {
    uint64_t key;  // a packed block key
    int32_t row;
    uint32_t pass;  // the pass that wrote it
  };
  std::vector<Entry> entries = std::vector<Entry>(kRecentBlocks, Entry{0, -1, 0});
  uint32_t pass = 0;

  uint32_t next_pass() {
    if (++pass == 0) {  // after 2^32 passes: every entry empty again
      std::fill(entries.begin(), entries.end(), Entry{0, -1, 0});
      pass = 1;
    }
    return pass;
  }
};
thread_local RecentBlocks t_recent_blocks;

// The rows of a part's block keys: a block seen again soon (the next scan line, the next sector
// of rings) reuses its key's row, found by a hash of its key among the blocks given out lately,
// instead of sending Open3D one more copy. A miss only costs a duplicate key, which the hash set
// takes as it always did.
class BlockRows {
 public:
  BlockRows(const BlockLayout& layout, int32_t* words)
      : layout_(layout),
        words_(words),
        recent_(t_recent_blocks.entries.data()),
        pass_(t_recent_blocks.next_pass()) {}
  int32_t row_of(uint64_t key) {
    RecentBlocks::Entry& seen = recent_[(key * 0x9E3779B97F4A7C15ull) >> (64 - kRecentBits)];
    if (seen.key == key && seen.pass == pass_) return seen.row;
    int32_t* out = words_ + rows_ * layout_.words;
    out[0] = (int32_t)(uint32_t)key;
    if (layout_.words == 2) out[1] = (int32_t)(uint32_t)(key >> 32);
    seen = RecentBlocks::Entry{key, (int32_t)rows_, pass_};
    return (int32_t)rows_++;
  }
  int64_t rows() const { return rows_; }

 private:
  const BlockLayout& layout_;
  int32_t* words_;
  RecentBlocks::Entry* recent_;
  uint32_t pass_;
  int64_t rows_ = 0;
};

}  // namespace
}  // namespace voxel
}  // namespace lidarseg
