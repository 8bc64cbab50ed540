#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace tandem::tools {

// Writes an 8-bit RGB PNG: `rgb` holds height rows of width pixels, 3 bytes each.
absl::Status WritePng(const std::string& path, int width, int height,
                      const std::vector<uint8_t>& rgb);

// A perceptually ordered colour for t in [0, 1] (dark blue through green to yellow, after
// matplotlib's viridis, sampled at five points and interpolated).
void HeatColor(double t, uint8_t* rgb);

}  // namespace tandem::tools
