#include "common/util/dtype.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(DTypeTest, Bf16RoundTripsRepresentableValues) {
  for (float f : {0.0f, 1.0f, -2.5f, 0.15625f, 65536.0f, -1e-3f}) {
    float back = Bf16ToF32(F32ToBf16(f));
    EXPECT_NEAR(back, f, std::fabs(f) * (1.0f / 128)) << f;
  }
  EXPECT_EQ(Bf16ToF32(F32ToBf16(1.0f)), 1.0f);
  EXPECT_TRUE(std::isnan(Bf16ToF32(F32ToBf16(std::nanf("")))));
}

TEST(DTypeTest, Bf16RoundsToNearestEven) {
  // 1 + 2^-8 lies exactly between two bf16 values (1 and 1 + 2^-7): ties go to even (1).
  EXPECT_EQ(Bf16ToF32(F32ToBf16(1.0f + 1.0f / 256)), 1.0f);
  // Slightly above the tie rounds up.
  EXPECT_EQ(Bf16ToF32(F32ToBf16(1.0f + 1.0f / 256 + 1.0f / 4096)), 1.0f + 1.0f / 128);
}

TEST(DTypeTest, F16Conversions) {
  EXPECT_EQ(F16ToF32(0x3c00), 1.0f);
  EXPECT_EQ(F16ToF32(0xc000), -2.0f);
  EXPECT_EQ(F32ToF16(0.5f), 0x3800);
  EXPECT_EQ(F16ToF32(F32ToF16(65504.0f)), 65504.0f);
}

TEST(DTypeTest, BulkConversionMatchesScalar) {
  std::vector<float> src(37);
  for (size_t i = 0; i < src.size(); ++i) src[i] = std::sin(static_cast<float>(i)) * 10;
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
    std::vector<uint8_t> packed(src.size() * DTypeSize(t));
    FromFloat(t, src.data(), packed.data(), src.size());
    std::vector<float> back(src.size());
    ToFloat(t, packed.data(), back.data(), src.size());
    for (size_t i = 0; i < src.size(); ++i) {
      float expect = t == DType::kF32   ? src[i]
                     : t == DType::kF16 ? F16ToF32(F32ToF16(src[i]))
                                        : Bf16ToF32(F32ToBf16(src[i]));
      EXPECT_EQ(back[i], expect) << DTypeName(t) << " at " << i;
    }
  }
}

// The bulk bf16 conversion (8 values at a time) gives F32ToBf16's codes for every kind of
// value: zeros, subnormals, ties at many exponents, the largest finite values (which round to
// infinity), infinities, NaNs with their payloads, and random bit patterns; 1,003 values, so
// that the scalar tail runs too.
TEST(DTypeTest, BulkBf16GivesTheScalarCodes) {
  std::vector<uint32_t> bits = {0x00000000, 0x80000000, 0x00000001, 0x807fffff, 0x00008000,
                                0x00018000, 0x3f808000, 0x3f818000, 0x3f80ffff, 0x7f7fffff,
                                0xff7fffff, 0x7f7f8000, 0x7f800000, 0xff800000, 0x7f800001,
                                0xffc00000, 0x7fbfffff, 0xff800001, 0x7fffffff, 0xffffffff};
  std::mt19937 rng(11);
  while (bits.size() < 1003) bits.push_back(static_cast<uint32_t>(rng()));
  std::vector<float> src(bits.size());
  std::memcpy(src.data(), bits.data(), bits.size() * 4);
  std::vector<uint16_t> codes(src.size());
  FromFloat(DType::kBF16, src.data(), codes.data(), src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    ASSERT_EQ(codes[i], F32ToBf16(src[i])) << "bits 0x" << std::hex << bits[i];
  }
}

TEST(DTypeTest, ParseNames) {
  EXPECT_EQ(*ParseDType("bf16"), DType::kBF16);
  EXPECT_EQ(*ParseDType("FP16"), DType::kF16);
  EXPECT_EQ(*ParseDType("float32"), DType::kF32);
  EXPECT_FALSE(ParseDType("int4").ok());
}

}  // namespace
}  // namespace tandem
