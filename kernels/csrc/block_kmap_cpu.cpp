// CPU submanifold kernel-3 neighbour tables through a block index, for rows in any order (sorted
// rows take sorted_kmap_cpu.cpp instead). Multi-threaded with PyTorch's OpenMP runtime.
#include <omp.h>

#include <algorithm>
#include <climits>
#include <vector>

#include "api.h"
#include "cpu_common.h"

using namespace lidarseg;

// ---- Submanifold neighbour tables through a block index (kernel 3, dilation 1) ----
//
// Looking up every (voxel, offset) pair in the voxel hash table costs one random probe each
// (~1.2 M per KITTI frame). Instead the voxels are grouped into 4 x 4 x 4 blocks: a second hash
// table maps each occupied block (batch, floor(x / 4), floor(y / 4), floor(z / 4)) to a 64-bit
// occupancy mask and to its voxels' rows, ordered by position inside the block. Every block then
// looks up its neighbouring blocks once, unpacks them into small dense arrays that stay in L1, and
// resolves all of its voxels' neighbours by array indexing. The result is the same nbr table as
// ls_kmap_lookup_cpu, entry for entry; only the work order differs.

namespace {

constexpr int kBlockVolume = 64;        // 4 x 4 x 4 voxels
constexpr int kNeighbourBlocks = 27;    // block deltas in {-1, 0, 1}^3, (dx+1)*9 + (dy+1)*3 + dz+1
constexpr int kSelfBlock = 13;          // delta (0, 0, 0)
constexpr int64_t kMaxBlockOffsets = 27;  // every offset in {-1, 0, 1}^3

int popcount64(uint64_t v) {
#if defined(__POPCNT__) || defined(__aarch64__)
  return __builtin_popcountll(v);
#else  // portable bit count: without -mpopcnt the builtin becomes a library call
  v = v - ((v >> 1) & 0x5555555555555555ull);
  v = (v & 0x3333333333333333ull) + ((v >> 2) & 0x3333333333333333ull);
  v = (v + (v >> 4)) & 0x0f0f0f0f0f0f0f0full;
  return (int)((v * 0x0101010101010101ull) >> 56);
#endif
}

// Block key of a voxel: the arithmetic shift is floor division by 4, also for negative values.
// Block coordinates of in-range voxels are always in range themselves.
uint64_t block_key(const int32_t* c) { return pack_key(c[0], c[1] >> 2, c[2] >> 2, c[3] >> 2); }

// Position of a voxel inside its block (x slowest), 0..63; '& 3' is the floor remainder.
int block_position(int32_t x, int32_t y, int32_t z) {
  return (x & 3) << 4 | (y & 3) << 2 | (z & 3);
}

// Key of neighbouring block b (0..26) of the block with key `key`. Block coordinates lie within
// +-2^15, far from the ends of their 18-bit fields, so adding -1 or +1 to a field never carries.
uint64_t neighbour_key(uint64_t key, int b) {
  const int64_t dx = b / 9 - 1, dy = (b / 3) % 3 - 1, dz = b % 3 - 1;
  return key + (uint64_t)(dx * (1ll << (2 * kCoordBits)) + dy * (1ll << kCoordBits) + dz);
}

// One slot of the block table. Besides the key (same packing, hash and linear probing as Slot)
// it holds everything a neighbour look-up needs, so a hit costs a single cache line.
struct BlockSlot {
  uint64_t key;        // kEmptyKey when free
  uint64_t occupancy;  // bit p set when position p of the block holds a voxel
  int64_t base;        // first entry of the block's rows in BlockIndex::rows
  uint64_t unused;     // pads the slot to 32 bytes, two per cache line
};

struct BlockIndex {
  uint64_t mask = 0;               // capacity - 1
  std::vector<BlockSlot> table;
  std::vector<int32_t> blocks;     // occupied slots in insertion order: nearby blocks together
  std::vector<int32_t> rows;       // voxel rows by (block, position in block)
};

// Smallest power of two >= 2 * num_keys, at least 16 (the load factor of kernels/hashtable.py).
uint64_t table_capacity(int64_t num_keys) {
  uint64_t capacity = 16;
  while (capacity < 2 * (uint64_t)num_keys) capacity *= 2;
  return capacity;
}

// Slot of `key`, claiming a free one if needed (*inserted tells); -1 after kMaxProbes slots. The
// plain read first skips the atomic exchange for blocks that already exist, the common case.
int64_t block_insert(BlockSlot* table, uint64_t mask, uint64_t key, bool* inserted) {
  uint64_t slot = home_slot(key, mask);
  *inserted = false;
  for (int i = 0; i < kMaxProbes; ++i) {
    uint64_t seen = __atomic_load_n(&table[slot].key, __ATOMIC_ACQUIRE);
    if (seen == kEmptyKey) seen = atomic_cas_u64(&table[slot].key, kEmptyKey, key);
    if (seen == kEmptyKey) *inserted = true;
    if (seen == kEmptyKey || seen == key) return (int64_t)slot;
    slot = (slot + 1) & mask;
  }
  return -1;
}

// Slot holding `key`, or -1. Call only after all inserts have finished.
int64_t block_find(const BlockSlot* table, uint64_t mask, uint64_t key) {
  uint64_t slot = home_slot(key, mask);
  for (int i = 0; i < kMaxProbes; ++i) {
    const uint64_t k = table[slot].key;
    if (k == key) return (int64_t)slot;
    if (k == kEmptyKey) return -1;
    slot = (slot + 1) & mask;
  }
  return -1;
}

// Per offset and per position in a block: which neighbouring block (0..26) and which position in
// it holds the neighbour, packed as block * 64 + position. needs[b] has bit p set when some
// offset takes position p into neighbouring block b.
struct OffsetPlan {
  int64_t num_offsets = 0;
  uint16_t target[kMaxBlockOffsets][kBlockVolume];
  uint64_t needs[kNeighbourBlocks];
};

bool make_plan(const int32_t* offsets, int64_t num_offsets, OffsetPlan* plan) {
  if (num_offsets < 0 || num_offsets > kMaxBlockOffsets) return false;
  plan->num_offsets = num_offsets;
  for (int b = 0; b < kNeighbourBlocks; ++b) plan->needs[b] = 0;
  for (int64_t k = 0; k < num_offsets; ++k) {
    const int32_t* d = offsets + 3 * k;
    if (d[0] < -1 || d[0] > 1 || d[1] < -1 || d[1] > 1 || d[2] < -1 || d[2] > 1) return false;
    for (int p = 0; p < kBlockVolume; ++p) {
      // Local coordinates of the neighbour, in -1..4: the block delta is floor(local / 4).
      const int32_t x = (p >> 4) + d[0], y = ((p >> 2) & 3) + d[1], z = (p & 3) + d[2];
      const int b = ((x >> 2) + 1) * 9 + ((y >> 2) + 1) * 3 + ((z >> 2) + 1);
      plan->target[k][p] = (uint16_t)(b * kBlockVolume + block_position(x, y, z));
      plan->needs[b] |= 1ull << p;
    }
  }
  return true;
}

// Inserts every voxel's block key, records its slot in slot_of and sets its position bit; appends
// the blocks in the order their first voxel inserted them. Returns false when some insert ran out
// of probes, so the caller retries with a larger table; on the last try such rows are reported.
bool insert_blocks(const int32_t* coords, int64_t n, BlockIndex* idx, int32_t* slot_of,
                   bool last_try, int64_t* err) {
  BlockSlot* table = idx->table.data();
  int full = 0;
  std::vector<std::vector<int32_t>> inserted_by(omp_get_max_threads());
#pragma omp parallel if (n >= kParallelRows)
  {
    std::vector<int32_t>& mine = inserted_by[omp_get_thread_num()];
    // Static schedule: each thread walks one run of rows in order, so its list is in row order.
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      if (__atomic_load_n(&full, __ATOMIC_RELAXED)) continue;  // a retry follows: skip the rest
      const int32_t* c = coords + 4 * i;
      if (!coord_in_range(c[0], c[1], c[2], c[3])) {
        report_error(err, kStatusOutOfRange, i);
        continue;
      }
      bool inserted = false;
      const int64_t slot = block_insert(table, idx->mask, block_key(c), &inserted);
      if (slot < 0) {
        if (last_try) report_error(err, kStatusProbeLimit, i);
        else __atomic_store_n(&full, 1, __ATOMIC_RELAXED);
        continue;
      }
      slot_of[i] = (int32_t)slot;
      if (inserted) mine.push_back((int32_t)slot);
      const uint64_t bit = 1ull << block_position(c[1], c[2], c[3]);
      if (__atomic_fetch_or(&table[slot].occupancy, bit, __ATOMIC_RELAXED) & bit) {
        report_error(err, kStatusDuplicate, i);
      }
    }
  }
  idx->blocks.clear();
  for (const std::vector<int32_t>& list : inserted_by) {
    idx->blocks.insert(idx->blocks.end(), list.begin(), list.end());
  }
  return !full;
}

// Gives each block its first entry in `rows` (blocks in list order; for sorted input that is
// spatial order, which keeps neighbour look-ups and nbr writes local), then places every voxel's
// row at that entry plus its rank among the block's occupied positions.
void order_rows(const int32_t* coords, int64_t n, const int32_t* slot_of, BlockIndex* idx) {
  int64_t next = 0;
  for (const int32_t s : idx->blocks) {
    idx->table[s].base = next;
    next += popcount64(idx->table[s].occupancy);
  }
  idx->rows.resize(n);
#pragma omp parallel for schedule(static) if (n >= kParallelRows)
  for (int64_t i = 0; i < n; ++i) {
    const int32_t* c = coords + 4 * i;
    const BlockSlot& block = idx->table[slot_of[i]];
    const uint64_t below = (1ull << block_position(c[1], c[2], c[3])) - 1;
    idx->rows[block.base + popcount64(block.occupancy & below)] = (int32_t)i;
  }
}

// Builds the block index of coords [n, 4]. Returns false when err received a bad row.
bool build_block_index(const int32_t* coords, int64_t n, BlockIndex* idx, int64_t* err) {
  std::vector<int32_t> slot_of(n);
  // LiDAR scans hold about 3 to 5 voxels per block, so the first table has room for n / 4 blocks
  // at load factor 0.5. A sparser cloud is redone with a table sized for the blocks counted (or,
  // when the table overflowed, for one block per voxel, which cannot overflow in practice).
  int64_t room = n / 4;
  for (;;) {
    const uint64_t capacity = table_capacity(room);
    idx->mask = capacity - 1;
    idx->table.assign(capacity, BlockSlot{kEmptyKey, 0, 0, 0});
    const bool last_try = room >= n;
    const bool fits = insert_blocks(coords, n, idx, slot_of.data(), last_try, err);
    if (has_error(err)) return false;
    const int64_t num_blocks = (int64_t)idx->blocks.size();
    if (fits && (last_try || (uint64_t)num_blocks * 5 <= capacity * 3)) break;  // load <= 0.6
    room = fits ? num_blocks : n;
  }
  order_rows(coords, n, slot_of.data(), idx);
  return true;
}

// Writes the rows of `block` into dense[64] by position (-1 where no voxel is).
void unpack_block(const BlockIndex& idx, const BlockSlot& block, int32_t* dense) {
  std::fill(dense, dense + kBlockVolume, kMiss);
  const int32_t* rows = idx.rows.data() + block.base;
  int j = 0;
  for (uint64_t m = block.occupancy; m; m &= m - 1) dense[__builtin_ctzll(m)] = rows[j++];
}

// Resolves every voxel of block `slot`: nbr[k * n + row] for each offset k, hits added to tally.
void resolve_block(const BlockIndex& idx, const OffsetPlan& plan, int32_t slot, int64_t n,
                   int32_t* nbr, int64_t* tally) {
  const BlockSlot& self = idx.table[slot];
  // Unpack this block and the neighbouring blocks that its voxels reach into L1-sized arrays.
  int32_t dense[kNeighbourBlocks * kBlockVolume];
  for (int b = 0; b < kNeighbourBlocks; ++b) {
    if (!(plan.needs[b] & self.occupancy)) continue;
    const int64_t s =
        b == kSelfBlock ? slot : block_find(idx.table.data(), idx.mask, neighbour_key(self.key, b));
    if (s >= 0) {
      unpack_block(idx, idx.table[s], dense + b * kBlockVolume);
    } else {
      std::fill(dense + b * kBlockVolume, dense + (b + 1) * kBlockVolume, kMiss);
    }
  }
  // The block's own rows come in position order, like the bits of its occupancy.
  const int32_t* rows = idx.rows.data() + self.base;
  int j = 0;
  for (uint64_t m = self.occupancy; m; m &= m - 1) {
    const int p = __builtin_ctzll(m);
    const int32_t row = rows[j++];
    for (int64_t k = 0; k < plan.num_offsets; ++k) {
      const int32_t v = dense[plan.target[k][p]];
      nbr[k * n + row] = v;
      tally[k] += v >= 0;
    }
  }
}

}  // namespace

LS_API int ls_submanifold_nbr_cpu(const int32_t* coords, int64_t n, const int32_t* offsets,
                                  int64_t num_offsets, int32_t* nbr, int64_t* counts,
                                  int64_t* err) {
  OffsetPlan plan;
  if (n < 0 || n > INT32_MAX || !make_plan(offsets, num_offsets, &plan)) {
    return kStatusBadArgument;
  }
  for (int64_t k = 0; k < num_offsets; ++k) counts[k] = 0;
  BlockIndex idx;
  if (!build_block_index(coords, n, &idx, err)) return kStatusOk;  // the caller reads err
  const int64_t num_blocks = (int64_t)idx.blocks.size();
  // Contiguous runs of blocks per thread keep each thread's look-ups and writes local.
#pragma omp parallel if (n >= kParallelRows)
  {
    int64_t tally[kMaxBlockOffsets] = {0};
#pragma omp for schedule(static)
    for (int64_t i = 0; i < num_blocks; ++i) resolve_block(idx, plan, idx.blocks[i], n, nbr, tally);
    for (int64_t k = 0; k < num_offsets; ++k) {
      if (tally[k]) __atomic_fetch_add(&counts[k], tally[k], __ATOMIC_RELAXED);
    }
  }
  return kStatusOk;
}
