#include "common/kernels/cpu/elementwise.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::kernels {
namespace {

std::vector<float> RandomVector(size_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& f : v) f = dist(rng);
  return v;
}

TEST(RmsNormTest, MatchesDoubleReference) {
  for (int64_t dim : {1, 7, 8, 33, 2048}) {
    const int64_t rows = 3;
    std::vector<float> x = RandomVector(rows * dim, -3.0f, 3.0f, dim);
    std::vector<float> weight = RandomVector(dim, 0.5f, 1.5f, dim + 1);
    std::vector<float> y(rows * dim);
    const float eps = 1e-5f;
    RmsNorm(x.data(), weight.data(), eps, rows, dim, y.data());
    for (int64_t r = 0; r < rows; ++r) {
      double ss = 0;
      for (int64_t i = 0; i < dim; ++i) ss += static_cast<double>(x[r * dim + i]) * x[r * dim + i];
      const double inv = 1.0 / std::sqrt(ss / dim + eps);
      for (int64_t i = 0; i < dim; ++i) {
        const double ref = x[r * dim + i] * inv * weight[i];
        ASSERT_NEAR(y[r * dim + i], ref, 1e-5 * std::abs(ref) + 1e-7)
            << "dim=" << dim << " row=" << r << " i=" << i;
      }
    }
  }
}

TEST(RmsNormTest, InPlaceEqualsOutOfPlace) {
  const int64_t dim = 45;
  std::vector<float> x = RandomVector(2 * dim, -2.0f, 2.0f, 3);
  std::vector<float> weight = RandomVector(dim, -1.0f, 1.0f, 4);
  std::vector<float> y(2 * dim);
  RmsNorm(x.data(), weight.data(), 1e-6f, 2, dim, y.data());
  RmsNorm(x.data(), weight.data(), 1e-6f, 2, dim, x.data());
  EXPECT_EQ(x, y);
}

TEST(SiluMulTest, MatchesDoubleReference) {
  for (int64_t dim : {1, 8, 13, 1000}) {
    const int64_t rows = 2;
    std::vector<float> gate_up = RandomVector(rows * 2 * dim, -20.0f, 20.0f, dim);
    // Saturated and special inputs: exp overflow/underflow must not produce NaN.
    const float special[] = {-100.0f, 100.0f, 0.0f, -88.0f, 89.0f, 1e-8f};
    for (int i = 0; i < 6 && i < dim; ++i) gate_up[i] = special[i];
    std::vector<float> out(rows * dim);
    SiluMul(gate_up.data(), rows, dim, out.data());
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t i = 0; i < dim; ++i) {
        const double g = gate_up[r * 2 * dim + i];
        const double u = gate_up[r * 2 * dim + dim + i];
        const double ref = g / (1.0 + std::exp(-g)) * u;
        ASSERT_NEAR(out[r * dim + i], ref, 2e-6 * std::abs(ref) + 1e-30)
            << "dim=" << dim << " g=" << g << " u=" << u;
      }
    }
  }
}

TEST(AddInPlaceTest, AddsElementwise) {
  for (int64_t n : {1, 8, 19}) {
    std::vector<float> y = RandomVector(n, -1.0f, 1.0f, n);
    std::vector<float> x = RandomVector(n, -1.0f, 1.0f, n + 100);
    std::vector<float> expected(n);
    for (int64_t i = 0; i < n; ++i) expected[i] = y[i] + x[i];
    AddInPlace(y.data(), x.data(), n);
    EXPECT_EQ(y, expected);
  }
}

std::vector<float> InvFreq(int head_dim, double theta) {
  std::vector<float> f(head_dim / 2);
  for (int j = 0; j < head_dim / 2; ++j) {
    f[j] = static_cast<float>(1.0 / std::pow(theta, 2.0 * j / head_dim));
  }
  return f;
}

// Double-precision rotate_half over the inv_freq values as given (f32).
std::vector<double> RopeReference(const std::vector<float>& x, int heads, int head_dim, int64_t pos,
                                  const std::vector<float>& inv_freq) {
  std::vector<double> out(x.begin(), x.end());
  const int half = head_dim / 2;
  for (int h = 0; h < heads; ++h) {
    for (int j = 0; j < half; ++j) {
      const double a = static_cast<double>(pos) * inv_freq[j];
      const double lo = x[h * head_dim + j];
      const double hi = x[h * head_dim + half + j];
      out[h * head_dim + j] = lo * std::cos(a) - hi * std::sin(a);
      out[h * head_dim + half + j] = hi * std::cos(a) + lo * std::sin(a);
    }
  }
  return out;
}

void ExpectRopeMatches(int heads, int head_dim, int64_t pos, const std::vector<float>& inv_freq,
                       uint32_t seed) {
  std::vector<float> x = RandomVector(heads * head_dim, -2.0f, 2.0f, seed);
  std::vector<double> ref = RopeReference(x, heads, head_dim, pos, inv_freq);
  ApplyRope(x.data(), heads, head_dim, pos, inv_freq.data());
  for (size_t i = 0; i < x.size(); ++i) {
    // |x| <= 2, so a few f32 ulps of the rotated pair; a float angle would be off by ~1e-2.
    ASSERT_NEAR(x[i], ref[i], 2e-6) << "head_dim=" << head_dim << " pos=" << pos << " i=" << i;
  }
}

TEST(ApplyRopeTest, MatchesDoubleReferenceAtLargePositions) {
  for (int head_dim : {6, 64, 80, 128}) {
    const std::vector<float> inv_freq = InvFreq(head_dim, 500000.0);
    for (int64_t pos : {0, 1, 7, 4097, 100000, 131071}) {
      ExpectRopeMatches(3, head_dim, pos, inv_freq, static_cast<uint32_t>(pos + head_dim));
    }
  }
}

TEST(ApplyRopeTest, CachedAnglesFollowChangedInputs) {
  // Same buffer, new values and positions: a stale cos/sin table would be caught here.
  std::vector<float> inv_freq = InvFreq(64, 10000.0);
  ExpectRopeMatches(2, 64, 500, inv_freq, 1);
  ExpectRopeMatches(2, 64, 500, inv_freq, 2);
  ExpectRopeMatches(2, 64, 501, inv_freq, 3);
  for (float& f : inv_freq) f *= 0.5f;
  ExpectRopeMatches(2, 64, 501, inv_freq, 4);
  ExpectRopeMatches(2, 32, 501, inv_freq, 5);  // shorter table, same pointer and position
}

TEST(ApplyRopeTest, PositionZeroIsIdentity) {
  std::vector<float> inv_freq = InvFreq(16, 10000.0);
  std::vector<float> x = RandomVector(32, -1.0f, 1.0f, 9);
  std::vector<float> y = x;
  ApplyRope(y.data(), 2, 16, 0, inv_freq.data());
  EXPECT_EQ(x, y);
}

}  // namespace
}  // namespace tandem::kernels
