// An LSD radix sort for the CPU passes (voxel_order_cpu.cpp sorts the voxels' bitmap words with
// it), and the uninitialized arrays it swaps between. Host only.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace lidarseg {
namespace {  // internal to the one file that includes it, as when it lived there

// n PODs left uninitialized (std::vector would zero them first): for arrays whose every element
// is written before it is read.
template <typename T>
std::unique_ptr<T[]> uninitialized(size_t n) {
  return std::unique_ptr<T[]>(new T[n]);
}

// LSD radix sort of items by digit(item, shift) over `bits` bits, in as few passes of at most
// 12-bit digits as they need (a KITTI frame's 24-bit word keys in two passes: 0.2 ms less than
// three of 8 bits on a Zen 1 core); stable. All the passes' histograms come from one read of the
// items.
template <typename Item, typename Digit>
void radix_sort(std::unique_ptr<Item[]>& items, int64_t n, int bits, Digit digit) {
  constexpr int kMaxDigitBits = 12;
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

}  // namespace
}  // namespace lidarseg
