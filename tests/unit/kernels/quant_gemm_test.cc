// The GEMM over quantized panels (WeightLayout::kQuantPanels) against a double-precision
// reference computed from the codes, scales and zeros as the format defines them, and the
// round-to-nearest quantizer against GPTQ's definition.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "common/kernels/cpu/gemm.h"
#include "common/kernels/cpu/gemm_internal.h"
#include "common/kernels/cpu/gemm_tiled_parts.h"
#include "common/kernels/cpu/quant_pack.h"
#include "common/util/dtype.h"
#include "common/util/thread_pool.h"
#include "gtest/gtest.h"

namespace tandem::kernels {
namespace {

// A quantized matrix with random codes, scales and zeros, kept both as the source rows and
// packed into panels. With `extremes`, every third row's even columns hold the largest code
// and the next row's the smallest.
class RandomQuantMatrix {
 public:
  RandomQuantMatrix(const QuantFormat& f, int64_t rows, int64_t cols, uint32_t seed,
                    ThreadPool& pool, bool extremes = false)
      : cols_(cols) {
    const int64_t g = f.group_size > 0 ? f.group_size : cols;
    groups_ = cols / g;
    group_size_ = g;
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int> code(0, (1 << f.bits) - 1);
    std::uniform_real_distribution<float> scale(0.001f, 0.05f);
    codes_.resize(rows * cols);
    scales_.resize(rows * groups_);
    zeros_.resize(rows * groups_);
    for (auto& c : codes_) c = static_cast<uint8_t>(code(rng));
    for (int64_t r = 0; extremes && r < rows; ++r) {
      if (r % 3 == 2) continue;
      for (int64_t k = 0; k < cols; k += 2)
        codes_[r * cols + k] = r % 3 == 0 ? (1 << f.bits) - 1 : 0;
    }
    for (auto& s : scales_) s = scale(rng);
    for (auto& z : zeros_) z = f.has_zero ? static_cast<uint8_t>(code(rng)) : 1 << (f.bits - 1);
    buffer_.resize(QuantPanelBytes(f, rows, cols) + 64);
    auto* aligned = reinterpret_cast<uint8_t*>(
        (reinterpret_cast<uintptr_t>(buffer_.data()) + 63) & ~uintptr_t{63});
    matrix_ = PackQuantPanels(
        f, DType::kBF16, rows, cols,
        [&](int64_t r, uint8_t* c, float* s, uint8_t* z) {
          std::copy_n(codes_.data() + r * cols, cols, c);
          std::copy_n(scales_.data() + r * groups_, groups_, s);
          if (f.has_zero) std::copy_n(zeros_.data() + r * groups_, groups_, z);
        },
        aligned, pool);
  }

  // The weight the format defines: (code - zero) * scale.
  double Weight(int64_t r, int64_t k) const {
    const int64_t g = k / group_size_;
    return (static_cast<double>(codes_[r * cols_ + k]) - zeros_[r * groups_ + g]) *
           scales_[r * groups_ + g];
  }
  const WeightMatrix& matrix() const { return matrix_; }
  int64_t groups() const { return groups_; }
  const std::vector<uint8_t>& codes() const { return codes_; }
  const std::vector<float>& scales() const { return scales_; }
  const std::vector<uint8_t>& zeros() const { return zeros_; }

 private:
  int64_t cols_, groups_ = 0, group_size_ = 0;
  std::vector<uint8_t> codes_, zeros_;
  std::vector<float> scales_;
  std::vector<uint8_t> buffer_;
  WeightMatrix matrix_;
};

std::vector<float> RandomVector(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& f : v) f = dist(rng);
  return v;
}

std::string Describe(const QuantFormat& f) {
  return "int" + std::to_string(f.bits) + " group " + std::to_string(f.group_size) +
         (f.has_zero ? " with zeros" : " symmetric") + (f.int8_activations ? " a8" : "");
}

const QuantFormat kFormats[] = {{8, -1, false}, {8, 32, true}, {8, 128, false},
                                {4, 32, false}, {4, 64, true}, {4, -1, true},
                                {4, 128, false}, {4, 256, true}};
// (n, k): tails of a 16-row panel and of the 64-row block, K below, at and across 256-column
// blocks. Each format runs the shapes whose k its group divides.
const std::pair<int64_t, int64_t> kShapes[] = {{1, 32}, {7, 13}, {33, 96}, {5, 256},
                                               {70, 576}, {200, 1024}, {17, 1280}};
const int64_t kMs[] = {1, 2, 3, 5, 8, 13, 17, 64};

TEST(QuantGemmTest, MatchesReferenceAtEveryM) {
  uint32_t seed = 1;
  const bool avx512 = internal::UseAvx512QuantKernels(true);
  for (int threads : {1, 2, 3}) {
    // One pass on the AVX2 kernels where AVX-512 would be taken.
    if (avx512) internal::UseAvx512QuantKernels(threads != 3);
    ThreadPool pool(threads);
    for (const QuantFormat& f : kFormats) {
      for (auto [n, k] : kShapes) {
        if (!CheckQuantFormat(f, k).ok()) continue;
        const RandomQuantMatrix w(f, n, k, seed++, pool);
        std::mt19937 rng(seed++);
        std::vector<float> bias = RandomVector(n, rng);
        for (int64_t m : kMs) {
          SCOPED_TRACE(::testing::Message()
                       << Describe(f) << " m=" << m << " n=" << n << " k=" << k
                       << " threads=" << threads << " avx512=" << (avx512 && threads != 3));
          std::vector<float> x = RandomVector(m * k, rng);
          std::vector<float> y(m * (n + 3), 7.0f);
          Gemm(x.data(), m, k, w.matrix(), bias.data(), y.data(), n + 3, pool);
          const double tolerance = (k / 8 + 16 + 2 * w.groups()) * std::ldexp(1.0, -24);
          for (int64_t i = 0; i < m; ++i) {
            for (int64_t j = 0; j < n; ++j) {
              double ref = bias[j], magnitude = std::abs(ref);
              for (int64_t t = 0; t < k; ++t) {
                const double p = x[i * k + t] * w.Weight(j, t);
                ref += p;
                magnitude += std::abs(p);
              }
              ASSERT_NEAR(y[i * (n + 3) + j], ref, tolerance * magnitude + 1e-6)
                  << "at " << i << "," << j;
            }
            for (int64_t j = n; j < n + 3; ++j) ASSERT_EQ(y[i * (n + 3) + j], 7.0f);
          }
        }
      }
    }
  }
  internal::UseAvx512QuantKernels(true);
}

// Decode streams the codes, prefill converts them to f32 first, a few rows take a wider kernel:
// every path sums in the same order, so a row's result is bit-identical alone or in a batch.
TEST(QuantGemmTest, ResultsDoNotDependOnBatchSize) {
  ThreadPool pool(2);
  std::mt19937 rng(3);
  const int64_t n = 200, k = 576, rows = 70;
  std::vector<float> x = RandomVector(rows * k, rng);
  for (const QuantFormat& f : kFormats) {
    if (!CheckQuantFormat(f, k).ok()) continue;
    SCOPED_TRACE(Describe(f));
    const RandomQuantMatrix w(f, n, k, 11, pool);
    std::vector<float> batch(rows * n);
    Gemm(x.data(), rows, k, w.matrix(), nullptr, batch.data(), n, pool);
    for (int64_t m : {1, 2, 5, 13, 40}) {
      std::vector<float> part(m * n);
      Gemm(x.data(), m, k, w.matrix(), nullptr, part.data(), n, pool);
      for (int64_t i = 0; i < m * n; ++i) ASSERT_EQ(part[i], batch[i]) << "m=" << m << " at " << i;
    }
  }
}

// Where the CPU has AVX-512, decode runs 16-lane kernels, and prefill (m = 70: the codes
// converted to f32 first) two 16-row panels a call; every lane performs the AVX2 kernel's
// operations in the same order, so both give the same bits (and each matches the reference).
TEST(QuantGemmTest, Avx512AndAvx2GiveTheSameBits) {
  if (!internal::UseAvx512QuantKernels(true)) GTEST_SKIP() << "this CPU has no AVX-512";
  ThreadPool pool(2);
  std::mt19937 rng(6);
  const int64_t n = 100, k = 1280;
  for (const QuantFormat& f : kFormats) {
    if (!CheckQuantFormat(f, k).ok()) continue;
    SCOPED_TRACE(Describe(f));
    const RandomQuantMatrix w(f, n, k, 12, pool);
    for (int64_t m : {1, 2, 7, 13, 20, 70}) {
      std::vector<float> x = RandomVector(m * k, rng), wide(m * n), narrow(m * n);
      ASSERT_TRUE(internal::UseAvx512QuantKernels(true));
      Gemm(x.data(), m, k, w.matrix(), nullptr, wide.data(), n, pool);
      internal::UseAvx512QuantKernels(false);
      Gemm(x.data(), m, k, w.matrix(), nullptr, narrow.data(), n, pool);
      ASSERT_EQ(wide, narrow) << "m=" << m;
    }
  }
  internal::UseAvx512QuantKernels(true);
}

TEST(QuantGemmTest, MultiEqualsSeparateProducts) {
  ThreadPool pool(2);
  std::mt19937 rng(4);
  const int64_t k = 256;
  const RandomQuantMatrix a({4, 32, false}, 48, k, 1, pool), b({4, 32, false}, 100, k, 2, pool);
  for (int64_t m : {1, 4, 30}) {
    std::vector<float> x = RandomVector(m * k, rng);
    std::vector<float> ya(m * 48), yb(m * 100), sa(m * 48), sb(m * 100);
    const GemmOutput outs[] = {{a.matrix(), nullptr, ya.data(), 48},
                               {b.matrix(), nullptr, yb.data(), 100}};
    GemmMulti(x.data(), m, k, outs, pool);
    Gemm(x.data(), m, k, a.matrix(), nullptr, sa.data(), 48, pool);
    Gemm(x.data(), m, k, b.matrix(), nullptr, sb.data(), 100, pool);
    EXPECT_EQ(ya, sa);
    EXPECT_EQ(yb, sb);
  }
}

// An act-order matrix (input_order) multiplies x's columns in its order: the same bits as the
// plain matrix times x gathered, at every M, alone and beside a matrix that reads x plainly.
TEST(QuantGemmTest, InputOrderGathersX) {
  ThreadPool pool(2);
  std::mt19937 rng(6);
  const int64_t n = 40, k = 256;
  for (const QuantFormat& f : {QuantFormat{4, 32, true}, QuantFormat{8, 64, false}}) {
    SCOPED_TRACE(Describe(f));
    const RandomQuantMatrix plain(f, n, k, 7, pool);
    std::vector<int32_t> order(k);
    for (int64_t j = 0; j < k; ++j) order[j] = static_cast<int32_t>(j);
    std::shuffle(order.begin(), order.end(), rng);
    WeightMatrix ordered = plain.matrix();
    ordered.input_order = order.data();
    for (int64_t m : {1, 3, 17}) {
      std::vector<float> x = RandomVector(m * k, rng), gathered(m * k);
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < k; ++j) gathered[i * k + j] = x[i * k + order[j]];
      }
      std::vector<float> got(m * n), want(m * n), beside(m * n), beside_want(m * n);
      Gemm(x.data(), m, k, ordered, nullptr, got.data(), n, pool);
      Gemm(gathered.data(), m, k, plain.matrix(), nullptr, want.data(), n, pool);
      EXPECT_EQ(got, want) << "m " << m;
      const GemmOutput outs[] = {{ordered, nullptr, got.data(), n},
                                 {plain.matrix(), nullptr, beside.data(), n}};
      GemmMulti(x.data(), m, k, outs, pool);
      Gemm(x.data(), m, k, plain.matrix(), nullptr, beside_want.data(), n, pool);
      EXPECT_EQ(got, want) << "m " << m;
      EXPECT_EQ(beside, beside_want) << "m " << m;
      // ReadRow gives the row in x's order.
      std::vector<float> row(k);
      ReadRow(ordered, 5, row.data());
      for (int64_t j = 0; j < k; ++j) ASSERT_FLOAT_EQ(row[order[j]], plain.Weight(5, j));
    }
  }
}

// W8A8: each row of x is rounded to int8 (scale max|x| / 127) before the product. The float
// kernels multiply x rounded and back; the integer kernels' own test follows.
TEST(QuantGemmTest, Int8ActivationsRoundEachRowOfX) {
  const bool vnni = internal::UseVnniQuantKernels(false);
  internal::UseAvx2IntegerQuantKernels(false);
  ThreadPool pool(2);
  std::mt19937 rng(8);
  const int64_t n = 24, k = 128;
  const RandomQuantMatrix plain({8, -1, false}, n, k, 9, pool);
  WeightMatrix a8 = plain.matrix();
  a8.quant.int8_activations = true;
  for (int64_t m : {1, 9}) {
    std::vector<float> x = RandomVector(m * k, rng), rounded(m * k);
    if (m > 1) std::fill_n(x.begin() + (m - 1) * k, k, 0.0f);  // an all-zero row stays zero
    for (int64_t i = 0; i < m; ++i) {
      float absmax = 0;
      for (int64_t j = 0; j < k; ++j) absmax = std::max(absmax, std::fabs(x[i * k + j]));
      const float s = absmax / 127.0f;
      for (int64_t j = 0; j < k; ++j) {
        const float q = s > 0 ? std::nearbyint(x[i * k + j] / s) : 0.0f;
        ASSERT_LE(std::fabs(q), 127.0f);
        rounded[i * k + j] = q * s;
      }
    }
    std::vector<float> got(m * n), want(m * n), unrounded(m * n);
    Gemm(x.data(), m, k, a8, nullptr, got.data(), n, pool);
    Gemm(rounded.data(), m, k, plain.matrix(), nullptr, want.data(), n, pool);
    Gemm(x.data(), m, k, plain.matrix(), nullptr, unrounded.data(), n, pool);
    EXPECT_EQ(got, want) << "m " << m;
    EXPECT_NE(got, unrounded) << "m " << m;
  }
  internal::UseVnniQuantKernels(vnni);
  internal::UseAvx2IntegerQuantKernels(true);
}

// RoundToInt8 works 32, then 8, then 1 code at a time: every length gives the scalar codes.
TEST(QuantGemmTest, RoundToInt8GivesTheScalarCodesAtEveryLength) {
  std::mt19937 rng(12);
  for (int64_t n : {1, 7, 8, 9, 31, 32, 33, 40, 63, 64, 65, 100, 130}) {
    std::vector<float> x = RandomVector(n, rng);
    x[n / 2] = -3.0f;  // the largest magnitude, negative: code -127
    std::vector<int8_t> got(n + 32, 99);
    const float s = internal::tiled::RoundToInt8(x.data(), n, got.data());
    ASSERT_EQ(s, 3.0f / 127.0f) << "n " << n;
    for (int64_t j = 0; j < n; ++j) {
      ASSERT_EQ(got[j], static_cast<int8_t>(std::nearbyint(x[j] / s))) << "n " << n << " j " << j;
    }
    EXPECT_EQ(got[n / 2], -127);
    for (int64_t j = n; j < n + 32; ++j) ASSERT_EQ(got[j], 99) << "wrote past n " << n;
  }
  std::vector<float> zeros(40, 0.0f);
  std::vector<int8_t> codes(40, 5);
  EXPECT_EQ(internal::tiled::RoundToInt8(zeros.data(), 40, codes.data()), 0.0f);
  EXPECT_EQ(codes, std::vector<int8_t>(40, 0));
}

// x rounded to int8 as the format defines it, written out here: s = max|x| / 127 (f32) over
// each `block` columns (0: the row), x' = round(x / s) * s, in double.
std::vector<double> RoundedX(const std::vector<float>& x, int64_t m, int64_t k, int64_t block) {
  std::vector<double> out(m * k);
  if (block == 0) block = k;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t b0 = 0; b0 < k; b0 += block) {
      const int64_t b1 = std::min(k, b0 + block);
      float absmax = 0;
      for (int64_t j = b0; j < b1; ++j) absmax = std::max(absmax, std::fabs(x[i * k + j]));
      const float s = absmax / 127.0f;
      for (int64_t j = b0; j < b1; ++j) {
        out[i * k + j] = s > 0 ? static_cast<double>(std::nearbyint(x[i * k + j] / s)) * s : 0.0;
      }
    }
  }
  return out;
}

const QuantFormat kInt8ActivationFormats[] = {
    {8, -1, false, true},     {8, 32, true, true},      {8, 128, false, true, 32},
    {4, 32, false, true, 32}, {4, 64, true, true, 32},  {4, -1, true, true},
    {4, 128, false, true},    {4, 256, true, true, 32}, {4, 16, false, true, 32},
    {4, 8, true, true},       {8, 4, false, true}};

// The kernels that run int8 activations.
enum class A8Path { kVnni, kAvxVnni, kAvx2Integer, kFloat };
constexpr A8Path kA8Paths[] = {A8Path::kVnni, A8Path::kAvxVnni, A8Path::kAvx2Integer,
                               A8Path::kFloat};

// Selects `path`; false where this CPU cannot run it.
bool UseA8Path(A8Path path) {
  const bool vnni = internal::UseVnniQuantKernels(path == A8Path::kVnni);
  internal::UseAvx2IntegerQuantKernels(path == A8Path::kAvx2Integer || path == A8Path::kAvxVnni);
  const bool avx_vnni = internal::UseAvxVnniIntegerQuantKernels(path == A8Path::kAvxVnni);
  return path == A8Path::kVnni ? vnni : path == A8Path::kAvxVnni ? avx_vnni : true;
}

// Back to what the CPU has.
void UseBestA8Path() {
  internal::UseVnniQuantKernels(true);
  internal::UseAvx2IntegerQuantKernels(true);
  internal::UseAvxVnniIntegerQuantKernels(true);
}

const char* Name(A8Path path) {
  switch (path) {
    case A8Path::kVnni:
      return "vnni";
    case A8Path::kAvxVnni:
      return "avx-vnni";
    case A8Path::kAvx2Integer:
      return "avx2";
    case A8Path::kFloat:
      return "float";
  }
  return "?";
}

// Int8 activations on the integer kernels (AVX512-VNNI and AVX-VNNI where the CPU has them;
// AVX2) and on the float kernels: each against the product of the rounded x and the dequantized
// weights, at every M, and each gives a row the same bits at every M.
TEST(QuantGemmTest, Int8ActivationsMatchTheReferenceAtEveryM) {
  ThreadPool pool(2);
  uint32_t seed = 21;
  for (A8Path path : kA8Paths) {
    if (!UseA8Path(path)) continue;
    for (const QuantFormat& f : kInt8ActivationFormats) {
      for (auto [n, k] : kShapes) {
        if (!CheckQuantFormat(f, k).ok()) continue;
        const RandomQuantMatrix w(f, n, k, seed++, pool);
        std::mt19937 rng(seed++);
        const int64_t rows = 17;
        std::vector<float> x = RandomVector(rows * k, rng);
        for (int64_t j = 0; j < k; j += 5) x[j] *= 40.0f;  // outliers in row 0
        std::fill_n(x.begin() + 3 * k, k, 0.0f);           // a row of zeros
        const std::vector<double> xr = RoundedX(x, rows, k, f.activation_block);
        std::vector<float> all(rows * n);
        for (int64_t m : {int64_t{1}, int64_t{2}, int64_t{7}, rows}) {
          SCOPED_TRACE(::testing::Message()
                       << Describe(f) << " block " << f.activation_block << " " << Name(path)
                       << " m=" << m << " n=" << n << " k=" << k);
          std::vector<float> y(m * n);
          Gemm(x.data(), m, k, w.matrix(), nullptr, y.data(), n, pool);
          const double tolerance = (k / 8 + 16 + 2 * w.groups()) * std::ldexp(1.0, -24);
          for (int64_t i = 0; i < m; ++i) {
            for (int64_t j = 0; j < n; ++j) {
              double ref = 0, magnitude = 0;
              for (int64_t t = 0; t < k; ++t) {
                const double p = xr[i * k + t] * w.Weight(j, t);
                ref += p;
                magnitude += std::abs(p);
              }
              ASSERT_NEAR(y[i * n + j], ref, tolerance * magnitude + 1e-6)
                  << "at " << i << "," << j;
            }
          }
          if (m == rows) all = y;
        }
        for (int64_t m : {1, 2, 7}) {
          std::vector<float> y(m * n);
          Gemm(x.data(), m, k, w.matrix(), nullptr, y.data(), n, pool);
          ASSERT_TRUE(std::equal(y.begin(), y.end(), all.begin()))
              << Describe(f) << " " << Name(path) << " m=" << m << " k=" << k;
        }
      }
    }
  }
  UseBestA8Path();
}

// The AVX2 integer kernels, with and without AVX-VNNI, sum the same integers as the AVX-512
// ones and scale them in the same order: the same bits, and not the float kernels' bits. Codes
// at both ends of their range (0 and 255 against x at -127 and 127) would overflow a 16-bit
// pair sum; the 8-bit kernels widen them first.
TEST(QuantGemmTest, IntegerKernelsGiveTheSameBitsOnEveryIsa) {
  ThreadPool pool(2);
  std::mt19937 rng(31);
  const int64_t n = 100, k = 1280;
  for (const QuantFormat& f : kInt8ActivationFormats) {
    if (!CheckQuantFormat(f, k).ok()) continue;
    SCOPED_TRACE(Describe(f));
    const RandomQuantMatrix w(f, n, k, 32, pool, /*extremes=*/true);
    for (int64_t m : {1, 2, 7, 13, 20}) {
      std::vector<float> x = RandomVector(m * k, rng);
      for (int64_t j = 0; j < k; j += 2) x[j] = 9.0f;  // x codes at 127
      std::map<A8Path, std::vector<float>> y;
      for (A8Path path : kA8Paths) {
        if (!UseA8Path(path)) continue;
        y[path].resize(m * n);
        Gemm(x.data(), m, k, w.matrix(), nullptr, y[path].data(), n, pool);
      }
      // Groups of 4 columns run the float kernels on every ISA (a sub-block is 8 columns).
      const std::vector<A8Path> integer = {A8Path::kVnni, A8Path::kAvxVnni, A8Path::kAvx2Integer};
      const std::vector<float>* first = nullptr;
      for (A8Path path : integer) {
        if (!y.contains(path)) continue;
        if (first == nullptr) first = &y[path];
        EXPECT_EQ(y[path], *first) << Name(path) << " m=" << m;
        if (f.group_size != 4) {
          EXPECT_NE(y[path], y[A8Path::kFloat]) << Name(path) << " m=" << m;
        }
      }
    }
  }
  UseBestA8Path();
}

// QuantKernelName says which kernels each path runs, as model-inspect info reports them.
TEST(QuantGemmTest, QuantKernelNameNamesThePath) {
  ThreadPool pool(2);
  const int64_t n = 32, k = 256;
  const RandomQuantMatrix int4(QuantFormat{4, 32, false, true, 32}, n, k, 41, pool);
  const RandomQuantMatrix int8(QuantFormat{8, -1, false, true}, n, k, 42, pool);
  const RandomQuantMatrix float_x(QuantFormat{4, 32, false}, n, k, 43, pool);
  const bool avx512 = internal::UseAvx512QuantKernels(true);
  const std::string float_isa = avx512 ? "AVX-512" : "AVX2";
  EXPECT_EQ(QuantKernelName(float_x.matrix()),
            "float (codes to f32 in registers, " + float_isa + ")");
  const std::map<A8Path, std::string> isa = {{A8Path::kVnni, "AVX512-VNNI vpdpbusd"},
                                             {A8Path::kAvxVnni, "AVX-VNNI vpdpbusd"},
                                             {A8Path::kAvx2Integer, "AVX2 vpmaddubsw"},
                                             {A8Path::kFloat, ""}};
  const std::string rounded =
      "float (codes to f32 in registers, " + float_isa + "; int8 activations rounded)";
  for (A8Path path : kA8Paths) {
    if (!UseA8Path(path)) continue;
    SCOPED_TRACE(Name(path));
    const bool integer = path != A8Path::kFloat;
    EXPECT_EQ(QuantKernelName(int4.matrix()), integer ? "integer (" + isa.at(path) + ")" : rounded);
    // Plain AVX2 multiplies 8-bit codes less 128 by x's codes with their signs moved over.
    const std::string int8_isa =
        path == A8Path::kAvx2Integer ? "AVX2 vpmaddubsw, sign trick" : isa.at(path);
    EXPECT_EQ(QuantKernelName(int8.matrix()), integer ? "integer (" + int8_isa + ")" : rounded);
  }
  UseBestA8Path();
  const RandomQuantMatrix odd_groups(QuantFormat{8, 4, false, true}, n, k, 44, pool);
  EXPECT_EQ(QuantKernelName(odd_groups.matrix()), rounded);  // sub-blocks are 8 columns
}

TEST(QuantGemmTest, ReadRowDequantizes) {
  ThreadPool pool(2);
  for (const QuantFormat& f : kFormats) {
    SCOPED_TRACE(Describe(f));
    const int64_t n = 19, k = 256;
    const RandomQuantMatrix w(f, n, k, 5, pool);
    std::vector<float> row(k);
    std::vector<uint8_t> codes(k), zeros(w.groups());
    std::vector<float> scales(w.groups());
    for (int64_t r = 0; r < n; ++r) {
      ReadRow(w.matrix(), r, row.data());
      for (int64_t t = 0; t < k; ++t) ASSERT_FLOAT_EQ(row[t], w.Weight(r, t)) << r << "," << t;
      ReadQuantRow(w.matrix(), r, codes.data(), scales.data(), zeros.data());
      ASSERT_TRUE(std::equal(codes.begin(), codes.end(), w.codes().begin() + r * k));
      ASSERT_TRUE(std::equal(scales.begin(), scales.end(), w.scales().begin() + r * w.groups()));
      ASSERT_TRUE(std::equal(zeros.begin(), zeros.end(), w.zeros().begin() + r * w.groups()));
    }
  }
}

TEST(QuantGemmTest, RefusesFormatsItCannotRun) {
  EXPECT_TRUE(CheckQuantFormat({4, 128, false}, 4096).ok());
  EXPECT_TRUE(CheckQuantFormat({8, -1, false}, 4095).ok());
  EXPECT_TRUE(CheckQuantFormat({8, 4095, false}, 4095).ok());  // one group per row, named
  const absl::Status bits = CheckQuantFormat({3, 128, false}, 4096);
  EXPECT_NE(bits.message().find("4 or 8 bits, got 3"), std::string::npos) << bits;
  const absl::Status divides = CheckQuantFormat({4, 128, false}, 1000);
  EXPECT_NE(divides.message().find("group size 128 does not divide the input dimension 1000"),
            std::string::npos)
      << divides;
  const absl::Status odd = CheckQuantFormat({4, 96, false}, 960);
  EXPECT_NE(odd.message().find("group size 96 is not supported"), std::string::npos) << odd;
  EXPECT_FALSE(CheckQuantFormat({4, 512, false}, 4096).ok());
}

// GPTQ's round-to-nearest (its Quantizer.find_params and quantize), worked by hand.
TEST(QuantizeRowTest, FollowsGptqRoundToNearest) {
  // Symmetric 4-bit, one group: max |w| = 1.5, scale = 3 / 15 = 0.2 (f16: 0.199951171875),
  // zero 8. 1.5 / 0.19995 = 7.5018 -> 8 + 8 = 16, clamped to 15; -1.5 -> -8 + 8 = 0.
  const float w[] = {1.5f, -1.5f, 0.0f, 0.3f, -0.1f, 0.7f, 1.0f, -0.55f};
  uint8_t codes[8], zeros[1];
  float scales[1];
  QuantizeRow({4, -1, false}, w, 8, codes, scales, zeros);
  EXPECT_EQ(scales[0], F16ToF32(F32ToF16(0.2f)));
  const uint8_t want[] = {15, 0, 8, 10, 7, 12, 13, 5};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(codes[i], want[i]) << i;

  // With zeros, two groups of 4: [0.5, 1.0, 2.0, 1.5] has min(w, 0) = 0: scale 2 / 15 (f16:
  // 0.13330078125, so 1.0 -> 7.5018 -> 8), zero 0; [-1, -0.5, 0.25, 0.5]: scale 1.5 / 15 = 0.1
  // (f16: 0.0999755859375, so 0.25 -> 2.5006 -> 3, not the tie 2.5 -> 2), zero round(10.0024).
  const float v[] = {0.5f, 1.0f, 2.0f, 1.5f, -1.0f, -0.5f, 0.25f, 0.5f};
  float s2[2];
  uint8_t z2[2];
  QuantizeRow({4, 4, true}, v, 8, codes, s2, z2);
  EXPECT_EQ(s2[0], F16ToF32(F32ToF16(2.0f / 15)));
  EXPECT_EQ(z2[0], 0);
  EXPECT_EQ(s2[1], F16ToF32(F32ToF16(0.1f)));
  EXPECT_EQ(z2[1], 10);
  const uint8_t want2[] = {4, 8, 15, 11, 0, 5, 13, 15};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(codes[i], want2[i]) << i;

  // An all-zero group gets scale 2 / maxq (GPTQ's xmin = -1, xmax = 1) and codes at the zero.
  const float zero[4] = {};
  QuantizeRow({8, -1, false}, zero, 4, codes, scales, zeros);
  EXPECT_EQ(scales[0], F16ToF32(F32ToF16(2.0f / 255)));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(codes[i], 128);
}

// Quantized weights stay within half a step of the originals (a full step where the
// symmetric grid clips its top code).
TEST(QuantizeRowTest, ErrorIsHalfAStep) {
  std::mt19937 rng(9);
  std::vector<float> w = RandomVector(512, rng);
  for (const QuantFormat& f : kFormats) {
    SCOPED_TRACE(Describe(f));
    const int64_t g = f.group_size > 0 ? f.group_size : 512;
    std::vector<uint8_t> codes(512), zeros(512 / g);
    std::vector<float> scales(512 / g);
    QuantizeRow(f, w.data(), 512, codes.data(), scales.data(), zeros.data());
    for (int64_t k = 0; k < 512; ++k) {
      const float zero = f.has_zero ? zeros[k / g] : 1 << (f.bits - 1);
      const float back = (codes[k] - zero) * scales[k / g];
      ASSERT_LE(std::abs(back - w[k]), scales[k / g] * 1.0001f) << k;
    }
  }
}

}  // namespace
}  // namespace tandem::kernels
