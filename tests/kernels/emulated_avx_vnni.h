// Test-only (tests/kernels/test_int8_emulated.py): force-included into a build of the CPU kernels
// so that the 256-bit AVX_VNNI int8 kernel runs on a CPU without AVX_VNNI. Its one AVX_VNNI
// instruction, vpdpbusd (per int32 lane: acc + four u8 * s8 products), is computed exactly by
// AVX2-level code instead, and the CPU check answers yes for "avxvnni". Everything else in that
// kernel (tiles, weight layout, scaling, the walk, the block hooks) is the shipped code.
#pragma once
#ifdef __cplusplus
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

__attribute__((target("avx2"))) static inline __v8si emulated_vpdpbusd(__v8si acc, __v8si u8,
                                                                       __v8si s8) {
  int32_t sums[8], u[8], s[8];
  memcpy(sums, &acc, sizeof(sums));
  memcpy(u, &u8, sizeof(u));
  memcpy(s, &s8, sizeof(s));
  for (int lane = 0; lane < 8; ++lane) {
    const uint8_t* a = reinterpret_cast<const uint8_t*>(&u[lane]);
    const int8_t* b = reinterpret_cast<const int8_t*>(&s[lane]);
    for (int j = 0; j < 4; ++j) sums[lane] += int32_t{a[j]} * int32_t{b[j]};
  }
  __v8si out;
  memcpy(&out, sums, sizeof(out));
  return out;
}

#define __builtin_ia32_vpdpbusd_v8si(acc, u8, s8) emulated_vpdpbusd((acc), (u8), (s8))
// (a macro is not expanded again inside its own expansion: the second call is the builtin)
#define __builtin_cpu_supports(feature) \
  (__builtin_strcmp((feature), "avxvnni") == 0 || __builtin_cpu_supports(feature))
#endif
