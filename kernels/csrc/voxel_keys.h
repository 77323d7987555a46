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

inline int bit_length(uint64_t v) {
  int bits = 0;
  for (; v; v >>= 1) ++bits;
  return bits;
}

}  // namespace voxel
}  // namespace lidarseg
