#include "common/kv/kv_rows.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "common/util/dtype.h"
#include "gtest/gtest.h"

namespace tandem::kv {
namespace {

TEST(KvRowsTest, FloatRowsRoundTripThroughTheirDtype) {
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    const KvLayout layout{2, 3, 8, 4, dtype};
    std::vector<uint8_t> block(layout.BlockBytes(), 0);
    const float in[8] = {1.0f, -2.5f, 0.125f, 3.0f, 0.0f, -1.0f, 0.5f, 8.0f};  // exact in all
    const KvRowRef row{1, 2, true, 3};
    WriteKvRow(block.data(), layout, row, in);
    float out[8];
    ReadKvRow(block.data(), layout, row, out);
    for (int i = 0; i < 8; ++i) EXPECT_EQ(out[i], in[i]) << DTypeName(dtype);
  }
}

// Each int8 element is off by at most half its row's scale, max |x| / 127 (plus the fp16
// rounding of the scale, relative 2^-11 of max |x|).
TEST(KvRowsTest, Int8RowsKeepEachValueWithinHalfAStep) {
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  const KvLayout layout{3, 2, 37, 16, DType::kI8};
  std::vector<uint8_t> block(layout.BlockBytes(), 0);
  for (int trial = 0; trial < 200; ++trial) {
    const KvRowRef row{trial % 3, trial % 2, trial % 5 == 0, trial % 16};
    std::vector<float> in(37);
    float max_abs = 0;
    for (float& x : in) max_abs = std::fmax(max_abs, std::fabs(x = dist(rng) * (trial + 1)));
    WriteKvRow(block.data(), layout, row, in.data());
    std::vector<float> out(37);
    ReadKvRow(block.data(), layout, row, out.data());
    const float step = max_abs / 127;
    for (int i = 0; i < 37; ++i) {
      ASSERT_LE(std::fabs(out[i] - in[i]), 0.5f * step + max_abs * 0x1p-10f) << trial << "," << i;
    }
  }
}

TEST(KvRowsTest, Int8RowsOfZerosInfinitiesAndNaNsStayFinite) {
  const KvLayout layout{1, 1, 4, 2, DType::kI8};
  std::vector<uint8_t> block(layout.BlockBytes(), 0xff);
  float out[4];
  const float zeros[4] = {0, 0, 0, 0};
  WriteKvRow(block.data(), layout, {0, 0, false, 0}, zeros);
  ReadKvRow(block.data(), layout, {0, 0, false, 0}, out);
  for (float x : out) EXPECT_EQ(x, 0.0f);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float bad[4] = {nan, 1.0f, -1.0f, 0.5f};
  WriteKvRow(block.data(), layout, {0, 0, true, 1}, bad);
  ReadKvRow(block.data(), layout, {0, 0, true, 1}, out);
  for (float x : out) EXPECT_TRUE(std::isfinite(x));
}

TEST(KvRowsTest, Int8LayoutIsAboutHalfOfFp16) {
  // Llama-3.2-1B geometry: 16 layers, 8 KV heads, head_dim 64.
  const KvLayout fp16{16, 8, 64, 16, DType::kF16}, int8{16, 8, 64, 16, DType::kI8};
  EXPECT_EQ(fp16.BytesPerToken(), 2u * 16 * 8 * 64 * 2);
  EXPECT_EQ(int8.BytesPerToken(), 2u * 16 * 8 * (64 + 2));
  EXPECT_EQ(int8.BlockBytes(), 16 * int8.BytesPerToken());
  EXPECT_NEAR(1.0 - double(int8.BytesPerToken()) / fp16.BytesPerToken(), 0.484, 0.001);
}

}  // namespace
}  // namespace tandem::kv
