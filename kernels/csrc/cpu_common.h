// Helpers shared by the CPU kernels (*_cpu.cpp) only: the CUDA twins report errors on the device.
#pragma once
#include <stdint.h>

namespace lidarseg {

// Below this many rows a parallel region costs more than the work (the deep levels of a UNet).
constexpr int64_t kParallelRows = 4096;

// Records an error in err = {status, row}: the first status seen wins, and for it the smallest
// row, so a parallel loop reports the same row whatever its thread schedule.
inline void report_error(int64_t* err, int status, int64_t row) {
  int64_t expected = 0;
  __atomic_compare_exchange_n(&err[0], &expected, (int64_t)status, false, __ATOMIC_ACQ_REL,
                              __ATOMIC_ACQUIRE);
  int64_t cur = __atomic_load_n(&err[1], __ATOMIC_RELAXED);
  while ((cur < 0 || row < cur) &&
         !__atomic_compare_exchange_n(&err[1], &cur, row, true, __ATOMIC_ACQ_REL,
                                      __ATOMIC_RELAXED)) {
  }
}

}  // namespace lidarseg
