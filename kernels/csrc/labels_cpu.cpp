// A response's labels as JSON text: "[l0,l1,...]" for uint8 labels, written byte by byte from a
// table of each value's text. json.dumps(labels.tolist()) makes a Python int per point (about 20
// ms for 125k points); numpy's gather of 4-byte slots and a pass dropping their padding took
// 2.9 ms on a Zen 1 core, mostly the gather of fixed-width strings and the compaction.
//
// Each value's text and comma sit in a 4-byte slot; the writer stores the whole slot and moves
// on by the text's length (2, 3 or 4 bytes), so there is no branch on the value: the next store
// overwrites the slot's spare bytes. Single-threaded: it runs on the service's event loop,
// where no OpenMP team may start (README, "Threads that fit the box").
#include <cstdint>
#include <cstring>

#include "api.h"
#include "cpu_common.h"

using namespace lidarseg;

namespace {

struct LabelText {
  uint8_t text[256][4];  // "7," "12," "255," (spare bytes 0)
  uint8_t length[256];   // 2, 3 or 4: the text with its comma

  constexpr LabelText() : text(), length() {
    for (int v = 0; v < 256; ++v) {
      int n = 0;
      if (v >= 100) text[v][n++] = static_cast<uint8_t>('0' + v / 100);
      if (v >= 10) text[v][n++] = static_cast<uint8_t>('0' + v / 10 % 10);
      text[v][n++] = static_cast<uint8_t>('0' + v % 10);
      text[v][n++] = ',';
      length[v] = static_cast<uint8_t>(n);
    }
  }
};

constexpr LabelText kLabelText;

}  // namespace

LS_API int ls_labels_json_cpu(const uint8_t* labels, int64_t n, uint8_t* out, int64_t capacity,
                              int64_t* written) {
  if (n < 0 || capacity < 4 * n + 2) return kStatusBadArgument;
  uint8_t* o = out;
  *o++ = '[';
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t v = labels[i];
    std::memcpy(o, kLabelText.text[v], 4);  // within 4 * n + 1: each text is at most 4 bytes
    o += kLabelText.length[v];
  }
  if (n > 0) --o;  // the last comma
  *o++ = ']';
  *written = o - out;
  return kStatusOk;
}
