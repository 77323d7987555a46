// What the int8 conv (fused_int8_cpu.cpp) does with each block of out rows it finishes, while
// they are in cache: quantize them for the next int8 conv, or run the network's head on them.
// Included by fused_int8_cpu.cpp (AVX-512) and fused_int8_avx2_cpu.cpp (AVX2) inside their
// anonymous namespaces, after head.h and their row quantizer: rows_u8 names its namespace
// (quantize_u8.h or quantize_u8_avx2.h), LS_INT8_ROWS_TARGET the target it is compiled for.
#pragma once

// The out rows of a finished block quantized as the next int8 conv reads them (rows_u8:
// the same bits as ls_quantize_rows_u8_cpu), while they are in cache, after the conv's ReLU when
// it is handed that; *failed |= 1 for a row that cannot be (a negative, NaN or infinite value).
// With `also` the rows quantized are an out row and the same row of also (also_cols wide) side
// by side, as ls_quantize_concat_u8_cpu does (a decoder's upsampling and its skip rows).
struct QuantizeBlock {
  int64_t cout;
  const float* also;
  int64_t also_cols;
  uint8_t* q;
  float* scale;
  int64_t* failed;

  bool takes_relu() const { return q != nullptr; }

  LS_INT8_ROWS_TARGET void operator()(int64_t first, int64_t end, bool relu, float* rows) const {
    if (q == nullptr) return;
    const float* more = also == nullptr ? nullptr : also + first * also_cols;
    const bool all =
        rows_u8::quantize_rows(rows + first * cout, cout, more, also_cols,
                                             end - first, relu, q + first * (cout + also_cols),
                                             scale + first);
    if (!all) __atomic_fetch_or(failed, (int64_t)1, __ATOMIC_RELAXED);
  }
};

// The network's head on the out rows of a finished block, after the conv's ReLU: each row's
// class (lidarseg::head_classes, the function ls_linear_argmax_u8_cpu runs: the same classes
// as the head on the rows written out), into labels. The pipeline's last conv: its rows are
// then never written to memory nor read back by the head.
struct HeadBlock {
  int64_t cout;
  const float* w_t;
  const float* bias;
  int64_t classes;
  uint8_t* labels;

  void operator()(int64_t first, int64_t end, bool relu, float* rows) const {
    float* block = rows + first * cout;
    if (relu) relu_rows(block, cout, end - first);
    lidarseg::head_classes(block, end - first, cout, w_t, bias, classes, labels + first);
  }

  LS_INT8_ROWS_TARGET static void relu_rows(float* rows, int64_t cout, int64_t n) {
    for (int64_t r = 0; r < n; ++r) rows_u8::relu_row(rows + r * cout, cout);
  }
};

// What a finished block of out rows goes to: the next int8 conv's quantization, or the head.
struct AfterBlock {
  QuantizeBlock quantize;
  HeadBlock head;

  bool takes_relu() const { return quantize.takes_relu() || head.labels != nullptr; }

  void operator()(int64_t first, int64_t end, bool relu, float* rows) const {
    if (head.labels != nullptr) {
      head(first, end, relu, rows);
    } else {
      quantize(first, end, relu, rows);
    }
  }
};
