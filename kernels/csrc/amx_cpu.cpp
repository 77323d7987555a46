// Whether the fused int8 and bf16 kernels run on AMX tiles (amx_tiles.h): the CPU's features,
// Linux's grant of the tile state, and a switch (on by default) that tests and benchmarks turn
// off to run the same convolution on the AVX-512 kernels side by side.
#include <atomic>

#include "amx_tiles.h"
#include "api.h"

namespace lidarseg {
namespace {

std::atomic<int> g_tiles_on{1};
std::atomic<int64_t> g_tile_convs{0};  // convs run on tiles since the process started

#if LS_HAVE_AMX
constexpr long kGetXcompPerm = 0x1022;  // arch_prctl codes (Linux 5.16+, asm/prctl.h)
constexpr long kReqXcompPerm = 0x1023;
constexpr int kXtileData = 18;          // the XSAVE feature number of the tile registers' state

// Asks Linux once per process for the tile state; true when it is granted.
bool tiles_granted() {
  static const bool granted = [] {
    if (syscall(SYS_arch_prctl, kReqXcompPerm, kXtileData) != 0) return false;
    unsigned long mask = 0;
    if (syscall(SYS_arch_prctl, kGetXcompPerm, &mask) != 0) return false;
    return ((mask >> kXtileData) & 1) != 0;
  }();
  return granted;
}

bool cpu_has_tiles(TileKind kind) {
  if (!__builtin_cpu_supports("amx-tile")) return false;
  return kind == TileKind::kInt8 ? __builtin_cpu_supports("amx-int8") != 0
                                 : __builtin_cpu_supports("amx-bf16") != 0;
}
#else
bool tiles_granted() { return false; }
bool cpu_has_tiles(TileKind) { return false; }
#endif

}  // namespace

bool tiles_ready(TileKind kind) {
  return g_tiles_on.load(std::memory_order_relaxed) != 0 && cpu_has_tiles(kind) &&
         tiles_granted();
}

void count_tile_conv() { g_tile_convs.fetch_add(1, std::memory_order_relaxed); }

}  // namespace lidarseg

LS_API int ls_amx_tiles_cpu(int32_t request, int32_t* kinds, int64_t* convs) {
  if (request < -1 || request > 1 || kinds == nullptr || convs == nullptr) {
    return lidarseg::kStatusBadArgument;
  }
  *convs = lidarseg::g_tile_convs.load(std::memory_order_relaxed);
  if (request >= 0) lidarseg::g_tiles_on.store(request, std::memory_order_relaxed);
  using lidarseg::TileKind;
  *kinds = (lidarseg::tiles_ready(TileKind::kInt8) ? (int)TileKind::kInt8 : 0) |
           (lidarseg::tiles_ready(TileKind::kBf16) ? (int)TileKind::kBf16 : 0);
  return lidarseg::kStatusOk;
}

LS_API int ls_amx_shape_fits_cpu(int64_t row_bytes, int64_t cout) {
  return lidarseg::amx::shape_fits(row_bytes, cout) ? lidarseg::kStatusOk
                                                    : lidarseg::kStatusBadArgument;
}
