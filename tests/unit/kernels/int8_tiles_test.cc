// 8-bit weights on AMX-INT8 tiles (WeightLayout::kInt8Tiles) against a scalar computation of
// the format's definition: x rounded to int8 per row, one exact integer per output, then
// fma(float(t) * s_x, s_w, bias). Every row count, on the tiles and on vpdpbusd, must give those
// bits; and the integers must stand for the dequantized product. Skipped where the CPU lacks
// AMX-INT8.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "common/kernels/cpu/gemm.h"
#include "common/kernels/cpu/int8_tiles.h"
#include "common/util/thread_pool.h"
#include "gtest/gtest.h"

namespace tandem::kernels {
namespace {

constexpr QuantFormat kW8A8{.bits = 8, .group_size = -1, .int8_activations = true};

// A random 8-bit matrix, one scale (and zero) per row, as rows and packed as kInt8Tiles.
struct RandomInt8Matrix {
  RandomInt8Matrix(bool has_zero, int64_t rows, int64_t cols, uint32_t seed, ThreadPool& pool)
      : rows(rows), cols(cols), codes(rows * cols), scales(rows), zeros(rows) {
    format = kW8A8;
    format.has_zero = has_zero;
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int> code(0, 255);
    std::uniform_real_distribution<float> scale(0.001f, 0.05f);
    for (auto& c : codes) c = static_cast<uint8_t>(code(rng));
    // The extremes, so that the sums reach their largest magnitudes.
    for (int64_t k = 0; k < cols; ++k) codes[k] = 255;
    if (rows > 1) std::fill_n(codes.begin() + cols, cols, 0);
    for (auto& s : scales) s = scale(rng);
    for (auto& z : zeros) z = has_zero ? static_cast<uint8_t>(code(rng)) : 128;
    buffer.resize(Int8TilesBytes(rows, cols) + 64);
    auto* aligned = reinterpret_cast<uint8_t*>(
        (reinterpret_cast<uintptr_t>(buffer.data()) + 63) & ~uintptr_t{63});
    matrix = PackInt8Tiles(
        format, DType::kBF16, rows, cols,
        [&](int64_t r, uint8_t* c, float* s, uint8_t* z) {
          std::copy_n(codes.data() + r * cols, cols, c);
          s[0] = scales[r];
          if (has_zero) z[0] = zeros[r];
        },
        aligned, pool);
  }

  // y[m, n] by the definition, one row of x at a time.
  std::vector<float> Expected(const std::vector<float>& x, int64_t m,
                              const std::vector<float>* bias) const {
    std::vector<float> y(m * rows);
    std::vector<int8_t> q(cols);
    for (int64_t i = 0; i < m; ++i) {
      const float* row = x.data() + i * cols;
      float absmax = 0.0f;
      for (int64_t k = 0; k < cols; ++k) absmax = std::max(absmax, std::fabs(row[k]));
      const float s_x = absmax / 127.0f;
      for (int64_t k = 0; k < cols; ++k) {
        q[k] = s_x == 0.0f ? 0 : static_cast<int8_t>(std::nearbyint(row[k] / s_x));
      }
      for (int64_t n = 0; n < rows; ++n) {
        int64_t t = 0;
        for (int64_t k = 0; k < cols; ++k) t += q[k] * (codes[n * cols + k] - zeros[n]);
        const float b = bias != nullptr ? (*bias)[n] : 0.0f;
        y[i * rows + n] = std::fma(static_cast<float>(t) * s_x, scales[n], b);
      }
    }
    return y;
  }

  QuantFormat format;
  int64_t rows, cols;
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  std::vector<uint8_t> zeros;
  std::vector<uint8_t> buffer;
  WeightMatrix matrix;
};

std::vector<float> RandomX(int64_t m, int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(m * k);
  for (auto& v : x) v = d(rng);
  // A row of zeros (scale 0) and one large outlier.
  if (m > 2) std::fill_n(x.begin() + 2 * k, k, 0.0f);
  x[0] = 40.0f;
  return x;
}

class Int8TilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!Int8TilesFit(kW8A8, 64)) GTEST_SKIP() << "this CPU has no AMX-INT8 tiles granted";
  }
  void TearDown() override {
    internal::SetInt8VnniRows(internal::kInt8VnniRows);
    internal::PairInt8Chunks(true);
  }
};

TEST_F(Int8TilesTest, EveryRowCountOnEitherKernelGivesTheDefinitionsBits) {
  ThreadPool pool(3);
  struct Shape {
    int64_t rows, cols;
  };
  for (const Shape shape :
       {Shape{64, 64}, Shape{33, 70}, Shape{100, 200}, Shape{200, 768}, Shape{130, 1001}}) {
    for (const bool has_zero : {false, true}) {
      const RandomInt8Matrix w(has_zero, shape.rows, shape.cols, 7, pool);
      std::vector<float> bias(shape.rows);
      for (int64_t n = 0; n < shape.rows; ++n) bias[n] = 0.01f * static_cast<float>(n % 17);
      for (const int64_t m : {1, 2, 3, 4, 5, 8, 16, 17, 31, 32, 33, 40, 48, 70}) {
        const std::vector<float> x = RandomX(m, shape.cols, static_cast<uint32_t>(m));
        const std::vector<float> expected = w.Expected(x, m, &bias);
        // 0: every count on the tiles; 1 << 20: every count on vpdpbusd; and the default.
        // The tiles with two chunks a pass and x in the tile layout (the default: pairs of 16,
        // then a pair or a single chunk for the rest), and one chunk a pass, x row-major.
        for (const int64_t vnni : {int64_t{0}, int64_t{1} << 20, internal::kInt8VnniRows}) {
          for (const bool pairs : {true, false}) {
            internal::SetInt8VnniRows(vnni);
            internal::PairInt8Chunks(pairs);
            std::vector<float> y(m * shape.rows, -1.0f);
            Gemm(x.data(), m, shape.cols, w.matrix, bias.data(), y.data(), shape.rows, pool);
            int64_t differ = 0;
            for (int64_t i = 0; i < m * shape.rows; ++i) differ += y[i] != expected[i] ? 1 : 0;
            ASSERT_EQ(differ, 0) << shape.rows << "x" << shape.cols << " zero " << has_zero << " m "
                                 << m << " vnni rows " << vnni << " pairs " << pairs << ": y[0] "
                                 << y[0] << " expected " << expected[0];
          }
        }
      }
    }
  }
}

TEST_F(Int8TilesTest, ProductsStandForTheDequantizedWeights) {
  // The integers against a double product of x and the dequantized weights: the only error is
  // x's rounding to int8 (at most half a step of max|x| / 127 per element).
  ThreadPool pool(2);
  const RandomInt8Matrix w(true, 96, 512, 3, pool);
  const int64_t m = 20;
  const std::vector<float> x = RandomX(m, w.cols, 11);
  std::vector<float> y(m * w.rows);
  Gemm(x.data(), m, w.cols, w.matrix, nullptr, y.data(), w.rows, pool);
  for (int64_t i = 0; i < m; ++i) {
    double absmax = 0;
    for (int64_t k = 0; k < w.cols; ++k) absmax = std::max<double>(absmax, std::fabs(x[i * w.cols + k]));
    for (int64_t n = 0; n < w.rows; ++n) {
      double exact = 0, bound = 0;
      for (int64_t k = 0; k < w.cols; ++k) {
        const double wv = (w.codes[n * w.cols + k] - w.zeros[n]) * double{w.scales[n]};
        exact += x[i * w.cols + k] * wv;
        bound += std::fabs(wv) * absmax / 127.0 / 2.0;
      }
      ASSERT_NEAR(y[i * w.rows + n], exact, bound + 1e-5 * std::fabs(exact)) << i << "," << n;
    }
  }
}

TEST_F(Int8TilesTest, ProductsOfOneXShareItsRoundingAndRowsReadBack) {
  ThreadPool pool(2);
  const RandomInt8Matrix a(false, 70, 256, 1, pool), b(true, 130, 256, 2, pool);
  const int64_t m = 24;
  const std::vector<float> x = RandomX(m, 256, 5);
  std::vector<float> ya(m * 70), yb(m * 130);
  const GemmOutput outs[] = {{a.matrix, nullptr, ya.data(), 70}, {b.matrix, nullptr, yb.data(), 130}};
  GemmMulti(x.data(), m, 256, outs, pool);
  EXPECT_EQ(ya, a.Expected(x, m, nullptr));
  EXPECT_EQ(yb, b.Expected(x, m, nullptr));
  EXPECT_EQ(MatrixBytes(b.matrix), Int8TilesBytes(130, 256));
  std::vector<uint8_t> codes(256);
  float scale = 0;
  uint8_t zero = 0;
  for (const int64_t row : {0, 63, 64, 129}) {
    ReadInt8TilesRow(b.matrix, row, codes.data(), &scale, &zero);
    EXPECT_TRUE(std::equal(codes.begin(), codes.end(), b.codes.begin() + row * 256)) << row;
    EXPECT_EQ(scale, b.scales[row]);
    EXPECT_EQ(zero, b.zeros[row]);
  }
  // ReadRow dequantizes.
  std::vector<float> row(256);
  ReadRow(b.matrix, 5, row.data());
  EXPECT_EQ(row[3], (b.codes[5 * 256 + 3] - b.zeros[5]) * b.scales[5]);
}

TEST(Int8TilesFitTest, OnlyPerRowEightBitPerTokenFormatsFit) {
  // (false everywhere on a CPU without AMX-INT8; there the first case is not checked)
  if (Int8TilesFit(kW8A8, 2048)) {
    EXPECT_TRUE(Int8TilesFit(QuantFormat{.bits = 8, .group_size = 2048, .int8_activations = true},
                             2048));
  }
  EXPECT_FALSE(Int8TilesFit(QuantFormat{.bits = 4, .group_size = -1, .int8_activations = true}, 2048));
  EXPECT_FALSE(Int8TilesFit(QuantFormat{.bits = 8, .group_size = 128, .int8_activations = true}, 2048));
  EXPECT_FALSE(Int8TilesFit(QuantFormat{.bits = 8, .group_size = -1}, 2048));
  EXPECT_FALSE(Int8TilesFit(
      QuantFormat{.bits = 8, .group_size = -1, .int8_activations = true, .activation_block = 32},
      2048));
  EXPECT_FALSE(Int8TilesFit(kW8A8, 70000));  // the integer sums could overflow
}

}  // namespace
}  // namespace tandem::kernels
