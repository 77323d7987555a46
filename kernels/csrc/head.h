// The pipeline's head and argmax on rows the caller has in hand (host only): engine_cpu.cpp's
// ls_linear_argmax_u8_cpu over a tensor, and the int8 conv that makes the network's last rows
// block by block (fused_int8_cpu.cpp), which never writes them out. One compiled function for
// both, so both give every row the same class.
#pragma once
#include <stdint.h>

namespace lidarseg {

// out[r] = argmax over o < cout of x[r] . w_t[:, o] + bias[o] (the first largest; the first NaN
// where a row has one), for rows [0, n) of x [n, cin]; w_t [cin, 32] zero beyond cout, bias
// [32], cout in 1..32. Serial: the caller splits the rows between threads.
void head_classes(const float* x, int64_t n, int64_t cin, const float* w_t, const float* bias,
                  int64_t cout, uint8_t* out);

}  // namespace lidarseg
