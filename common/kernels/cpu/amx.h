#pragma once

// What Tandem's own AMX kernels share (onednn_gemm.cc's GEMM tiles, attention_amx.cc's attention
// tiles): the permission to use the tile state, and loading a tile configuration. Internal to
// common/kernels/cpu.

#include <immintrin.h>

#include <array>
#include <cstdint>

#define TANDEM_AMX __attribute__((target("amx-tile,amx-bf16")))

namespace tandem::kernels::internal {

// Whether the CPU has AMX (as oneDNN reports it) and Linux gave this process the tile state,
// which it keeps off until a process asks: asked once per process, as oneDNN does for its own
// AMX kernels.
bool AmxTilesAllowed();

// Bytes a tile call asks into L2 while it runs, spread over its steps: a part of the slice of
// weights the same thread takes next (tile loads do not wake the hardware prefetchers, so a slice
// not asked for ahead arrives one tile load's wait at a time).
struct Ahead {
  const char* data = nullptr;
  int64_t bytes = 0;

  // Asks for step `step`'s share of the lines (of `steps`).
  void Step(int64_t step, int64_t steps) const {
    const int64_t lines = (bytes + 63) / 64;
    for (int64_t l = step * lines / steps; l < (step + 1) * lines / steps; ++l) {
      _mm_prefetch(data + l * 64, _MM_HINT_T1);
    }
  }
};

// ldtilecfg's operand.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Loads a tile configuration: tile t has `rows[t]` rows of 64 bytes. Loaded on every call that
// uses the tiles: oneDNN's kernels load their own on the same thread.
TANDEM_AMX inline void LoadTileConfig(const std::array<uint8_t, 8>& rows) {
  TileConfig config;
  for (int t = 0; t < 8; ++t) {
    config.rows[t] = rows[t];
    config.colsb[t] = 64;
  }
  asm volatile("" : : "r"(&config) : "memory");  // GCC 12 does not see ldtilecfg read it
  _tile_loadconfig(&config);
}

}  // namespace tandem::kernels::internal
