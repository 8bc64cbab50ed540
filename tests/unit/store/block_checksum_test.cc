#include "common/store/block_checksum.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace tandem::store {
namespace {

std::vector<uint8_t> Bytes(size_t n) {
  std::vector<uint8_t> v(n);
  uint32_t x = 12345;
  for (auto& b : v) b = static_cast<uint8_t>((x = x * 1103515245 + 12345) >> 16);
  return v;
}

// The fused copies hash in 16 KiB chunks; the digest must equal the one-shot hash at every
// size around the chunk boundaries, and the copy must be exact.
TEST(BlockChecksumTest, FusedCopiesMatchTheOneShotChecksum) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{63}, size_t{16383}, size_t{16384}, size_t{16385},
                   size_t{65536}, size_t{(1 << 20) + 3}}) {
    const std::vector<uint8_t> src = Bytes(n);
    const uint64_t expected = BlockChecksum64(src);
    std::vector<uint8_t> dst(n, 0xee);
    EXPECT_EQ(CopyWithChecksum64(dst, src), expected) << n;
    EXPECT_EQ(dst, src) << n;
    std::string appended = "prefix";
    EXPECT_EQ(AppendWithChecksum64(appended, src), expected) << n;
    EXPECT_EQ(appended, "prefix" + std::string(src.begin(), src.end())) << n;
  }
}

TEST(BlockChecksumTest, ChecksumsSeeEveryByte) {
  std::vector<uint8_t> v = Bytes(100000);
  const uint32_t c32 = BlockChecksum(v);
  const uint64_t c64 = BlockChecksum64(v);
  v[77777] ^= 1;
  EXPECT_NE(BlockChecksum(v), c32);
  EXPECT_NE(BlockChecksum64(v), c64);
}

}  // namespace
}  // namespace tandem::store
