#include "common/kernels/cpu/elementwise.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "common/kernels/cpu/cpu_backend.h"
#include "common/util/thread_pool.h"
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

// AVX-512 runs the same operations per element as AVX2 (RmsNorm's sum of squares in AVX2's
// lanes and order), so a worker's bits do not depend on which of the two its CPU has: a
// prefill worker on one CPU and a decode worker on the other compute the same model.
class VectorIsaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (BestVectorIsa() != VectorIsa::kAvx512) GTEST_SKIP() << "this CPU has no AVX-512";
  }
  // Lengths around every vector width and tail: 16 at a time, one 8, then single floats.
  static constexpr int64_t kDims[] = {1,  7,  8,  9,  15, 16, 17,  24,  31,   32,
                                      33, 40, 47, 63, 64, 65, 100, 768, 2048, 2055};
};

TEST_F(VectorIsaTest, RmsNormGivesAvx2Bits) {
  for (int64_t dim : kDims) {
    const int64_t rows = 3;
    std::vector<float> x = RandomVector(rows * dim, -3.0f, 3.0f, dim);
    x[0] = 1e-20f;  // tiny and large squares: the order of the sums shows in the bits
    if (dim > 1) x[1] = 3e4f;
    const std::vector<float> weight = RandomVector(dim, 0.5f, 1.5f, dim + 1);
    std::vector<float> y2(rows * dim), y512(rows * dim);
    RmsNorm(x.data(), weight.data(), 1e-5f, rows, dim, y2.data(), VectorIsa::kAvx2);
    RmsNorm(x.data(), weight.data(), 1e-5f, rows, dim, y512.data(), VectorIsa::kAvx512);
    ASSERT_EQ(y2, y512) << "dim=" << dim;
  }
}

TEST_F(VectorIsaTest, SiluMulGivesAvx2Bits) {
  for (int64_t dim : kDims) {
    const int64_t rows = 2;
    std::vector<float> gate_up = RandomVector(rows * 2 * dim, -30.0f, 30.0f, dim);
    const float special[] = {-100.0f, 100.0f, 0.0f, -88.0f, 89.0f, 1e-8f, -0.0f, 87.5f};
    for (int64_t i = 0; i < 8 && i < dim; ++i) gate_up[i] = special[i];
    std::vector<float> o2(rows * dim), o512(rows * dim);
    SiluMul(gate_up.data(), rows, dim, o2.data(), VectorIsa::kAvx2);
    SiluMul(gate_up.data(), rows, dim, o512.data(), VectorIsa::kAvx512);
    ASSERT_EQ(o2, o512) << "dim=" << dim;
  }
}

TEST_F(VectorIsaTest, AddAndRopeGiveAvx2Bits) {
  for (int64_t n : kDims) {
    std::vector<float> a = RandomVector(n, -1.0f, 1.0f, n), b = a;
    const std::vector<float> x = RandomVector(n, -1.0f, 1.0f, n + 7);
    AddInPlace(a.data(), x.data(), n, VectorIsa::kAvx2);
    AddInPlace(b.data(), x.data(), n, VectorIsa::kAvx512);
    ASSERT_EQ(a, b) << "n=" << n;
  }
  for (int head_dim : {6, 32, 48, 64, 80, 128}) {
    const std::vector<float> inv_freq = InvFreq(head_dim, 500000.0);
    for (int64_t pos : {1, 4097, 131071}) {
      std::vector<float> a = RandomVector(3 * head_dim, -2.0f, 2.0f, head_dim), b = a;
      ApplyRope(a.data(), 3, head_dim, pos, inv_freq.data(), VectorIsa::kAvx2);
      ApplyRope(b.data(), 3, head_dim, pos, inv_freq.data(), VectorIsa::kAvx512);
      ASSERT_EQ(a, b) << "head_dim=" << head_dim << " pos=" << pos;
    }
  }
}

// The CPU backend splits the element-wise passes across its pool by rows (runs of 16 floats for
// Add) once they are large enough: every split gives the single thread's bits, and every row.
TEST(CpuBackendElementwiseTest, PoolSplitsGiveOneThreadsBits) {
  ThreadPool pool(3);
  CpuBackend cpu(pool);
  for (int64_t rows : {1, 5, 64, 301}) {
    for (int64_t dim : {7, 768, 2048}) {
      const std::vector<float> x = RandomVector(rows * dim, -2.0f, 2.0f, rows + dim);
      const std::vector<float> w = RandomVector(dim, 0.5f, 1.5f, dim);
      std::vector<float> want(rows * dim), got(rows * dim, -1.0f);
      RmsNorm(x.data(), w.data(), 1e-6f, rows, dim, want.data());
      cpu.RmsNorm(x.data(), w.data(), 1e-6f, rows, dim, got.data());
      ASSERT_EQ(want, got) << "RmsNorm rows=" << rows << " dim=" << dim;

      const std::vector<float> gate_up = RandomVector(rows * 2 * dim, -8.0f, 8.0f, rows * dim);
      std::fill(got.begin(), got.end(), -1.0f);
      SiluMul(gate_up.data(), rows, dim, want.data());
      cpu.SiluMul(gate_up.data(), rows, dim, got.data());
      ASSERT_EQ(want, got) << "SiluMul rows=" << rows << " dim=" << dim;

      std::vector<float> a = x, b = x;
      const std::vector<float> d = RandomVector(rows * dim, -1.0f, 1.0f, 5);
      AddInPlace(a.data(), d.data(), rows * dim);
      cpu.Add(b.data(), d.data(), rows * dim);
      ASSERT_EQ(a, b) << "Add n=" << rows * dim;
    }
  }
}

}  // namespace
}  // namespace tandem::kernels
