#include "tools/model_inspect/png.h"

#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "common/util/file_util.h"

namespace tandem::tools {
namespace {

void AppendU32(std::string& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>(v >> shift));
}

// length, type, data, CRC of type and data.
void AppendChunk(std::string& out, std::string_view type, std::string_view data) {
  AppendU32(out, static_cast<uint32_t>(data.size()));
  const size_t start = out.size();
  out.append(type);
  out.append(data);
  const auto* crc_input = reinterpret_cast<const Bytef*>(out.data() + start);
  AppendU32(out, static_cast<uint32_t>(crc32(0, crc_input, static_cast<uInt>(out.size() - start))));
}

}  // namespace

absl::Status WritePng(const std::string& path, int width, int height,
                      const std::vector<uint8_t>& rgb) {
  if (width <= 0 || height <= 0 ||
      rgb.size() != static_cast<size_t>(width) * static_cast<size_t>(height) * 3) {
    return absl::InvalidArgumentError(absl::StrCat("PNG of ", width, "x", height, " needs ",
                                                   3LL * width * height, " bytes of RGB"));
  }
  // Each scanline starts with filter type 0 (none).
  std::string raw;
  raw.reserve(static_cast<size_t>(height) * (1 + 3 * static_cast<size_t>(width)));
  for (int y = 0; y < height; ++y) {
    raw.push_back('\0');
    raw.append(reinterpret_cast<const char*>(rgb.data()) + static_cast<size_t>(y) * width * 3,
               static_cast<size_t>(width) * 3);
  }
  uLongf packed_size = compressBound(raw.size());
  std::string packed(packed_size, '\0');
  if (compress2(reinterpret_cast<Bytef*>(packed.data()), &packed_size,
                reinterpret_cast<const Bytef*>(raw.data()), raw.size(), 9) != Z_OK) {
    return absl::InternalError("zlib could not compress the PNG image data");
  }
  packed.resize(packed_size);

  std::string png("\x89PNG\r\n\x1a\n", 8);
  std::string header;
  AppendU32(header, static_cast<uint32_t>(width));
  AppendU32(header, static_cast<uint32_t>(height));
  header.append({8, 2, 0, 0, 0});  // 8 bits, RGB, deflate, adaptive filters, no interlace
  AppendChunk(png, "IHDR", header);
  AppendChunk(png, "IDAT", packed);
  AppendChunk(png, "IEND", "");
  return WriteStringToFile(path, png);
}

void HeatColor(double t, uint8_t* rgb) {
  static constexpr double kStops[5][3] = {
      {68, 1, 84}, {59, 82, 139}, {33, 145, 140}, {94, 201, 98}, {253, 231, 37}};
  t = std::clamp(std::isfinite(t) ? t : 0.0, 0.0, 1.0) * 4;
  const int i = std::min(static_cast<int>(t), 3);
  const double f = t - i;
  for (int c = 0; c < 3; ++c) {
    rgb[c] =
        static_cast<uint8_t>(std::lround(kStops[i][c] + f * (kStops[i + 1][c] - kStops[i][c])));
  }
}

}  // namespace tandem::tools
