// The voxelizer's packed cell keys, shared by its passes (voxel_keys_cpu.cpp: the keys and their
// blocks; voxel_order_cpu.cpp: the first run of each key and the order of the voxels).
// A key packs (batch, x, y, z) as batch << 51 | x << 34 | y << 17 | z, each axis taken from the
// grid's origin, so ascending keys are ascending (batch, x, y, z).
#pragma once
#include <stdint.h>

namespace lidarseg {
namespace voxel {

constexpr int kAxisBits = 17;  // per axis, as app/inference/voxelize.py packs keys
constexpr int kBatchShift = 3 * kAxisBits;
constexpr int64_t kAxisCells = int64_t(1) << kAxisBits;

// The fields of a packed key: batch, x, y, z (as ls_voxel_keys_cpu packs them).
inline int64_t key_field(int64_t key, int f) {
  return f == 0 ? key >> kBatchShift : (key >> ((3 - f) * kAxisBits)) & (kAxisCells - 1);
}

// Field f of a key with each axis divided by 2^shift (the batch is never divided).
inline int64_t shifted_field(int64_t key, int f, int64_t shift) {
  return f == 0 ? key_field(key, 0) : key_field(key, f) >> shift;
}

// *packed = the key's shifted fields minus low[f] in width[f] bits each, batch first; false
// where a field falls outside [low[f], low[f] + 2^width[f]).
inline bool pack_fields(int64_t key, int64_t shift, const int64_t* low, const int32_t* width,
                        uint64_t* packed) {
  uint64_t p = 0;
  for (int f = 0; f < 4; ++f) {
    const int64_t offset = shifted_field(key, f, shift) - low[f];
    if (offset < 0 || offset >= (int64_t(1) << width[f])) return false;
    p = p << width[f] | uint64_t(offset);
  }
  *packed = p;
  return true;
}

inline int bit_length(uint64_t v) {
  int bits = 0;
  for (; v; v >>= 1) ++bits;
  return bits;
}

}  // namespace voxel
}  // namespace lidarseg
