// CPU twin of cuda/hash_cuda.cu: hash-table build and kernel-map lookup, multi-threaded with the
// OpenMP runtime that PyTorch itself loads (so torch.set_num_threads governs both).
#include <omp.h>

#include <cstring>

#include "api.h"
#include "cpu_common.h"

using namespace lidarseg;

namespace {

constexpr int64_t kBatch = 8;  // outputs whose probes are in flight together

}  // namespace

LS_API int ls_hash_build_cpu(const int32_t* coords, int64_t n, Slot* table, int64_t capacity,
                             int64_t* err) {
  if (!valid_table_rows(n, capacity)) return kStatusBadArgument;
  const uint64_t mask = (uint64_t)capacity - 1;
#pragma omp parallel for schedule(static) if (n >= kParallelRows)
  for (int64_t i = 0; i < n; ++i) {
    const int32_t* c = coords + 4 * i;
    if (!coord_in_range(c[0], c[1], c[2], c[3])) {
      report_error(err, kStatusOutOfRange, i);
      continue;
    }
    bool inserted = false;
    const int64_t slot = insert_or_find(table, mask, pack_key(c[0], c[1], c[2], c[3]), &inserted);
    if (slot < 0) {
      report_error(err, kStatusProbeLimit, i);
    } else if (!inserted) {
      report_error(err, kStatusDuplicate, i);
    } else {
      table[slot].value = (int32_t)i;
    }
  }
  return kStatusOk;
}

LS_API int ls_hash_insert_min_cpu(const int32_t* coords, int64_t n, int32_t stride, Slot* table,
                                  int64_t capacity, int64_t* slot_of_row, int64_t* err) {
  if (!valid_table_rows(n, capacity) || stride < 1) {
    return kStatusBadArgument;
  }
  const uint64_t mask = (uint64_t)capacity - 1;
#pragma omp parallel for schedule(static) if (n >= kParallelRows)
  for (int64_t i = 0; i < n; ++i) {
    const int32_t* c = coords + 4 * i;
    const int32_t x = floor_div(c[1], stride), y = floor_div(c[2], stride);
    const int32_t z = floor_div(c[3], stride);
    slot_of_row[i] = -1;
    if (!coord_in_range(c[0], c[1], c[2], c[3])) {  // then the coarse key is in range too
      report_error(err, kStatusOutOfRange, i);
      continue;
    }
    bool inserted = false;
    const int64_t slot = insert_or_find(table, mask, pack_key(c[0], x, y, z), &inserted);
    if (slot < 0) {
      report_error(err, kStatusProbeLimit, i);
      continue;
    }
    slot_of_row[i] = slot;
    atomic_min_i32(&table[slot].value, (int32_t)i);
  }
  return kStatusOk;
}

LS_API int ls_kmap_lookup_cpu(const Slot* table, int64_t capacity, const int32_t* out_coords,
                              int64_t n_out, int32_t stride, const int32_t* offsets,
                              int64_t num_offsets, int32_t* nbr, int64_t* counts) {
  if (!valid_capacity(capacity) || n_out < 0 || num_offsets < 0 || num_offsets > kMaxOffsets ||
      stride < 1) {
    return kStatusBadArgument;
  }
  const uint64_t mask = (uint64_t)capacity - 1;
  for (int64_t k = 0; k < num_offsets; ++k) counts[k] = 0;
  // Most probes miss and each lands on a random cache line, so the loop is latency-bound. It
  // works on kBatch outputs at a time: first it computes every key and prefetches its home slot,
  // then it probes, by which time most lines have arrived.
#pragma omp parallel if (n_out * num_offsets >= kParallelRows)
  {
    int64_t tally[kMaxOffsets] = {0};
    uint64_t keys[kBatch * kMaxOffsets];
#pragma omp for schedule(static)
    for (int64_t q0 = 0; q0 < n_out; q0 += kBatch) {
      const int64_t qn = (n_out - q0 < kBatch) ? n_out - q0 : kBatch;
      for (int64_t j = 0; j < qn; ++j) {
        const int32_t* c = out_coords + 4 * (q0 + j);
        for (int64_t k = 0; k < num_offsets; ++k) {
          const int32_t* d = offsets + 3 * k;
          const int64_t x = (int64_t)c[1] * stride + d[0], y = (int64_t)c[2] * stride + d[1];
          const int64_t z = (int64_t)c[3] * stride + d[2];
          uint64_t key = kEmptyKey;  // out of range: a miss, never an alias
          if (coord_in_range(c[0], x, y, z)) {
            key = pack_key(c[0], x, y, z);
            __builtin_prefetch(&table[home_slot(key, mask)]);
          }
          keys[j * num_offsets + k] = key;
        }
      }
      for (int64_t j = 0; j < qn; ++j) {
        for (int64_t k = 0; k < num_offsets; ++k) {
          const uint64_t key = keys[j * num_offsets + k];
          const int32_t v = key == kEmptyKey ? kMiss : find_value(table, mask, key);
          nbr[k * n_out + q0 + j] = v;
          tally[k] += v >= 0;
        }
      }
    }
    for (int64_t k = 0; k < num_offsets; ++k) {
      if (tally[k]) __atomic_fetch_add(&counts[k], tally[k], __ATOMIC_RELAXED);
    }
  }
  return kStatusOk;
}

LS_API int ls_kmap_compact_cpu(const int32_t* nbr, int64_t num_offsets, int64_t n_out,
                               const int64_t* starts, int32_t* in_idx, int32_t* out_idx) {
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t k = 0; k < num_offsets; ++k) {
    int64_t w = starts[k];
    for_each_hit_chunk(nbr + k * n_out, n_out, [&](const int32_t* in, const int32_t* out,
                                                   int64_t m) {
      std::memcpy(in_idx + w, in, sizeof(int32_t) * m);
      std::memcpy(out_idx + w, out, sizeof(int32_t) * m);
      w += m;
    });
  }
  return kStatusOk;
}

LS_API int ls_csr_by_key_cpu(const int32_t* keys, int64_t m, int64_t num_keys, int64_t* ptr,
                             int32_t* rows) {
  std::memset(ptr, 0, sizeof(int64_t) * (num_keys + 1));
  for (int64_t i = 0; i < m; ++i) {
    const int32_t k = keys[i];
    if (k >= num_keys) return kStatusBadArgument;
    if (k >= 0) ++ptr[k + 1];
  }
  for (int64_t k = 0; k < num_keys; ++k) ptr[k + 1] += ptr[k];
  // Second pass fills each bucket in row order (stable).
  int64_t* fill = new int64_t[num_keys > 0 ? num_keys : 1];
  std::memcpy(fill, ptr, sizeof(int64_t) * num_keys);
  for (int64_t i = 0; i < m; ++i) {
    const int32_t k = keys[i];
    if (k >= 0) rows[fill[k]++] = (int32_t)i;
  }
  delete[] fill;
  return kStatusOk;
}
