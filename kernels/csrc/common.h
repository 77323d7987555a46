// Shared by the CPU (*_cpu.cpp) and CUDA (cuda/*.cu) kernels: key packing, the hash function,
// the probe sequence and the status codes. Written once behind LS_HD so the twins cannot drift.
//
// Hash table layout: `capacity` slots (a power of two), each slot two int64 words:
//   word 0: the packed key (kEmptyKey = all ones when the slot is free)
//   word 1: low 32 bits = the value (a row index; kMiss = -1 when unset), high 32 bits reserved
// A table filled with -1 is therefore empty. Capacity is the next power of two >= 2 * rows
// (load factor <= 0.5, see kernels/hashtable.py). Probing is linear and bounded by kMaxProbes:
// an insert that needs more raises kStatusProbeLimit, so a lookup may stop there too.
//
// Key layout (64 bits, coordinates biased by 2^17 so they pack as unsigned fields):
//   bits 63..54  batch  in [0, kBatchMax]        (10 bits; 1023 is reserved, so no key is all ones)
//   bits 53..36  x      in [kCoordMin, kCoordMax] (18 bits)
//   bits 35..18  y      same range
//   bits 17..0   z      same range
// A coordinate outside these ranges is an error at insert time (kStatusOutOfRange) and a plain
// miss at lookup time: it is never wrapped into another key.
#pragma once
#include <stdint.h>

#if defined(__CUDACC__)
#define LS_HD __host__ __device__ __forceinline__
#else
#define LS_HD inline
#endif

namespace lidarseg {

constexpr int kCoordBits = 18;
constexpr int kBatchBits = 10;
constexpr int32_t kCoordMin = -(1 << (kCoordBits - 1));      // -131072
constexpr int32_t kCoordMax = (1 << (kCoordBits - 1)) - 1;   //  131071
constexpr int32_t kBatchMax = (1 << kBatchBits) - 2;         //  1022
constexpr uint64_t kEmptyKey = ~0ull;
constexpr int32_t kMiss = -1;
constexpr int kMaxProbes = 512;
constexpr int64_t kMaxOffsets = 343;  // per kernel-map lookup: up to a 7x7x7 kernel

// Status codes returned by every entry point (0 = success).
constexpr int kStatusOk = 0;
constexpr int kStatusOutOfRange = 1;   // a coordinate or batch index does not fit the key layout
constexpr int kStatusDuplicate = 2;    // the same (batch, x, y, z) appears twice
constexpr int kStatusProbeLimit = 3;   // an insert needed more than kMaxProbes slots
constexpr int kStatusBadArgument = 4;  // shapes, sizes or capacity are inconsistent
constexpr int kStatusCudaError = 5;    // a CUDA launch or copy failed

// Errors found inside kernels go to one int64 word `err` that the caller fills with kNoError
// (all ones, -1 as int64). A report stores pack_error(status, row) when it is below what the word
// holds, so the word ends as the minimum over every report: the lowest status and, for it, the
// smallest row. That is one answer for any thread schedule, on the CPU and on CUDA alike, and the
// row always belongs to the status reported.
constexpr int kErrorRowBits = 48;  // rows below 2^48; the status sits above them
constexpr uint64_t kNoError = ~0ull;

struct Slot {
  uint64_t key;
  int32_t value;
  int32_t reserved;
};

// A table's capacity is a power of two; it holds at most capacity / 2 rows (load factor 0.5), and
// at most INT32_MAX: rows are stored as int32 values (more would wrap to misses).
LS_HD bool valid_capacity(int64_t capacity) {
  return capacity > 0 && (capacity & (capacity - 1)) == 0;
}

LS_HD bool valid_table_rows(int64_t n, int64_t capacity) {
  return valid_capacity(capacity) && n >= 0 && n <= capacity / 2 && n <= INT32_MAX;
}

// 64-bit coordinates: a query computed as c * stride + d is checked before it could wrap.
LS_HD bool coord_in_range(int32_t b, int64_t x, int64_t y, int64_t z) {
  return b >= 0 && b <= kBatchMax && x >= kCoordMin && x <= kCoordMax && y >= kCoordMin &&
         y <= kCoordMax && z >= kCoordMin && z <= kCoordMax;
}

// Requires coord_in_range(b, x, y, z).
LS_HD uint64_t pack_key(int32_t b, int64_t x, int64_t y, int64_t z) {
  const uint64_t mask = (1ull << kCoordBits) - 1;
  const uint64_t ux = (uint64_t)(x - kCoordMin) & mask;
  const uint64_t uy = (uint64_t)(y - kCoordMin) & mask;
  const uint64_t uz = (uint64_t)(z - kCoordMin) & mask;
  return ((uint64_t)b << (3 * kCoordBits)) | (ux << (2 * kCoordBits)) | (uy << kCoordBits) | uz;
}

// splitmix64 finaliser: every input bit affects every output bit.
LS_HD uint64_t hash_key(uint64_t k) {
  k ^= k >> 30;
  k *= 0xbf58476d1ce4e5b9ull;
  k ^= k >> 27;
  k *= 0x94d049bb133111ebull;
  k ^= k >> 31;
  return k;
}

// Home slot of a key in a table of mask + 1 slots.
LS_HD uint64_t home_slot(uint64_t key, uint64_t mask) { return hash_key(key) & mask; }

// Floor division for a positive divisor (C++ '/' truncates towards zero).
LS_HD int32_t floor_div(int32_t a, int32_t s) {
  const int32_t q = a / s;
  return (a % s != 0 && a < 0) ? q - 1 : q;
}

LS_HD uint64_t atomic_cas_u64(uint64_t* addr, uint64_t expected, uint64_t desired) {
#if defined(__CUDA_ARCH__)
  return (uint64_t)atomicCAS((unsigned long long*)addr, (unsigned long long)expected,
                             (unsigned long long)desired);
#else
  __atomic_compare_exchange_n(addr, &expected, desired, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
  return expected;  // the value seen before the exchange
#endif
}

LS_HD void atomic_min_i32(int32_t* addr, int32_t v) {
#if defined(__CUDA_ARCH__)
  atomicMin(addr, v);
#else
  int32_t cur = __atomic_load_n(addr, __ATOMIC_RELAXED);
  while (v < cur && !__atomic_compare_exchange_n(addr, &cur, v, true, __ATOMIC_ACQ_REL,
                                                 __ATOMIC_RELAXED)) {
  }
#endif
}

LS_HD uint64_t pack_error(int status, int64_t row) {
  return ((uint64_t)status << kErrorRowBits) | ((uint64_t)row & ((1ull << kErrorRowBits) - 1));
}

LS_HD void report_error(int64_t* err, int status, int64_t row) {
  const uint64_t v = pack_error(status, row);
#if defined(__CUDA_ARCH__)
  atomicMin(reinterpret_cast<unsigned long long*>(err), (unsigned long long)v);
#else
  uint64_t* word = reinterpret_cast<uint64_t*>(err);
  uint64_t cur = __atomic_load_n(word, __ATOMIC_RELAXED);
  while (v < cur && !__atomic_compare_exchange_n(word, &cur, v, true, __ATOMIC_ACQ_REL,
                                                 __ATOMIC_RELAXED)) {
  }
#endif
}

// Insert `key` or find it. Returns the slot index, or -1 when kMaxProbes slots were all taken by
// other keys. *inserted tells whether this call claimed the slot.
LS_HD int64_t insert_or_find(Slot* table, uint64_t mask, uint64_t key, bool* inserted) {
  uint64_t slot = home_slot(key, mask);
  for (int i = 0; i < kMaxProbes; ++i) {
    const uint64_t seen = atomic_cas_u64(&table[slot].key, kEmptyKey, key);
    if (seen == kEmptyKey) {
      *inserted = true;
      return (int64_t)slot;
    }
    if (seen == key) {
      *inserted = false;
      return (int64_t)slot;
    }
    slot = (slot + 1) & mask;
  }
  *inserted = false;
  return -1;
}

// The value stored under `key`, or kMiss. Call only after all inserts have finished.
LS_HD int32_t find_value(const Slot* table, uint64_t mask, uint64_t key) {
  uint64_t slot = home_slot(key, mask);
  for (int i = 0; i < kMaxProbes; ++i) {
    const uint64_t k = table[slot].key;
    if (k == key) return table[slot].value;
    if (k == kEmptyKey) return kMiss;
    slot = (slot + 1) & mask;
  }
  return kMiss;
}

// The row kernels' argument checks, the same on both twins: kStatusBadArgument for a negative
// count or width (the CPU gather once passed a negative width to memset), or a row range that
// runs backwards; an empty one is kStatusOk with nothing to do (rows_to_do says which).
LS_HD int gather_args(int64_t n, int64_t c, int64_t m) {
  return n < 0 || c < 0 || m < 0 ? kStatusBadArgument : kStatusOk;
}
LS_HD int scatter_csr_args(int64_t c, int64_t n_out, int64_t row_lo, int64_t row_hi) {
  return c < 0 || n_out < 0 || row_lo < 0 || row_hi < row_lo ? kStatusBadArgument : kStatusOk;
}
LS_HD bool rows_to_do(int64_t rows, int64_t c) { return rows > 0 && c > 0; }

// First position in sorted[lo, hi) whose value is >= v.
template <typename T, typename V>
LS_HD int64_t lower_bound(const T* sorted, int64_t lo, int64_t hi, V v) {
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (sorted[mid] < v) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// Looks up (b, x, y, z); anything outside the key layout is a miss, never an alias.
LS_HD int32_t find_coord(const Slot* table, uint64_t mask, int32_t b, int64_t x, int64_t y,
                         int64_t z) {
  if (!coord_in_range(b, x, y, z)) return kMiss;
  return find_value(table, mask, pack_key(b, x, y, z));
}

}  // namespace lidarseg
