#include "common/kernels/cpu/gemm.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "common/kernels/cpu/gemm_internal.h"
#include "common/util/dtype.h"
#include "common/util/thread_pool.h"
#include "gtest/gtest.h"

namespace tandem::kernels {
namespace {

using GemmFn = std::function<void(const float*, int64_t, int64_t, const WeightMatrix&, const float*,
                                  float*, int64_t, ThreadPool&)>;

struct Problem {
  int64_t m, n, k, x_stride, y_stride;
  DType dtype;
  bool bias;
};

std::vector<float> RandomVector(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& f : v) f = dist(rng);
  return v;
}

// Runs `gemm` on random data and compares with a double-precision reference over the weights
// as stored (rounded to the dtype). Error bound: f32 accumulation, relative to sum |x| |w|.
void CheckGemm(const Problem& p, const GemmFn& gemm, ThreadPool& pool, uint32_t seed) {
  SCOPED_TRACE(::testing::Message()
               << "m=" << p.m << " n=" << p.n << " k=" << p.k << " dtype=" << DTypeName(p.dtype)
               << " bias=" << p.bias << " xs=" << p.x_stride << " ys=" << p.y_stride);
  std::mt19937 rng(seed);
  std::vector<float> x = RandomVector(p.m * p.x_stride, rng);
  std::vector<float> w_f32 = RandomVector(p.n * p.k, rng);
  std::vector<float> bias = RandomVector(p.n, rng);
  std::vector<uint8_t> w_stored(p.n * p.k * DTypeSize(p.dtype));
  FromFloat(p.dtype, w_f32.data(), w_stored.data(), w_f32.size());
  std::vector<float> w_rounded(p.n * p.k);
  ToFloat(p.dtype, w_stored.data(), w_rounded.data(), w_rounded.size());

  constexpr float kSentinel = 12345.0f;
  std::vector<float> y(p.m * p.y_stride, kSentinel);
  WeightMatrix w{w_stored.data(), p.dtype, p.n, p.k};
  gemm(x.data(), p.m, p.x_stride, w, p.bias ? bias.data() : nullptr, y.data(), p.y_stride, pool);

  // Eight f32 lanes each sum k/8 products, then a short reduction: ~(k/8 + 16) roundings.
  const double tolerance = (p.k / 8 + 16) * std::ldexp(1.0, -24);
  for (int64_t i = 0; i < p.m; ++i) {
    for (int64_t j = 0; j < p.n; ++j) {
      double ref = p.bias ? bias[j] : 0.0;
      double magnitude = std::abs(ref);
      for (int64_t t = 0; t < p.k; ++t) {
        const double prod = static_cast<double>(x[i * p.x_stride + t]) * w_rounded[j * p.k + t];
        ref += prod;
        magnitude += std::abs(prod);
      }
      ASSERT_NEAR(y[i * p.y_stride + j], ref, tolerance * magnitude + 1e-6)
          << "at " << i << "," << j;
    }
    // Padding between rows must be left alone.
    for (int64_t j = p.n; j < p.y_stride; ++j) ASSERT_EQ(y[i * p.y_stride + j], kSentinel);
  }
}

const DType kDTypes[] = {DType::kF32, DType::kF16, DType::kBF16};

// (n, k) pairs: tails in both, single row/column, more than one 96-row panel and more than one
// 512-column block in the tiled path.
const std::pair<int64_t, int64_t> kShapes[] = {{1, 1}, {7, 13}, {33, 100}, {5, 1030}, {200, 515}};
const int64_t kMs[] = {1, 2, 3, 5, 8, 17, 64};

void SweepShapes(const GemmFn& gemm, int threads) {
  ThreadPool pool(threads);
  uint32_t seed = 1;
  for (DType dtype : kDTypes) {
    for (auto [n, k] : kShapes) {
      for (int64_t m : kMs) {
        for (bool bias : {false, true}) {
          CheckGemm({m, n, k, k, n, dtype, bias}, gemm, pool, seed++);
        }
      }
    }
  }
}

// n x k random weights in [-1, 1) stored as dtype.
std::vector<uint8_t> RandomWeights(DType dtype, int64_t n, int64_t k, std::mt19937& rng) {
  const std::vector<float> w = RandomVector(n * k, rng);
  std::vector<uint8_t> stored(n * k * DTypeSize(dtype));
  FromFloat(dtype, w.data(), stored.data(), w.size());
  return stored;
}

TEST(GemmTest, MatchesReferenceTwoThreads) { SweepShapes(Gemm, 2); }

TEST(GemmTest, MatchesReferenceThreeThreads) { SweepShapes(Gemm, 3); }

TEST(GemmTest, StreamingPathAtEveryM) { SweepShapes(internal::GemmStreaming, 2); }

TEST(GemmTest, TiledPathAtEveryM) { SweepShapes(internal::GemmTiled, 3); }

// Packs row-major weights into panels, in a 32-byte aligned buffer as the loader's arena gives.
class Packed {
 public:
  Packed(const WeightMatrix& w, ThreadPool& pool)
      : buffer_(PanelBytes(w.dtype, w.rows, w.cols) + 32) {
    auto* aligned = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(buffer_.data()) + 31) &
                                               ~uintptr_t{31});
    matrix_ = PackPanels(w, aligned, pool);
  }
  const WeightMatrix& matrix() const { return matrix_; }

 private:
  std::vector<uint8_t> buffer_;
  WeightMatrix matrix_;
};

void GemmOnPanels(const float* x, int64_t m, int64_t x_stride, const WeightMatrix& w,
                  const float* bias, float* y, int64_t y_stride, ThreadPool& pool) {
  const Packed packed(w, pool);
  EXPECT_EQ(packed.matrix().layout, WeightLayout::kPanels);
  Gemm(x, m, x_stride, packed.matrix(), bias, y, y_stride, pool);
}

TEST(GemmTest, PanelsMatchReferenceAtEveryM) {
  SweepShapes(GemmOnPanels, 2);
  SweepShapes(GemmOnPanels, 3);
}

// Panel weights run one kernel family whose per-output reduction order is fixed, whatever the
// number of rows, the row grouping, the thread count or the in-register conversion: a row's
// result is bit-identical alone or in a batch, and equal to the row-major blocked kernel's.
TEST(GemmTest, PanelResultsDoNotDependOnBatchSize) {
  std::mt19937 rng(5);
  const int64_t n = 200, k = 515, rows = 70;
  std::vector<float> x = RandomVector(rows * k, rng);
  for (DType dtype : kDTypes) {
    SCOPED_TRACE(DTypeName(dtype));
    const std::vector<uint8_t> stored = RandomWeights(dtype, n, k, rng);
    const WeightMatrix w{stored.data(), dtype, n, k};
    ThreadPool two(2), three(3);
    const Packed packed(w, two);
    std::vector<float> expected(rows * n);
    internal::GemmTiled(x.data(), rows, k, w, nullptr, expected.data(), n, two);
    for (int64_t m : {1, 2, 3, 5, 7, 12, 13, 32, 49, 70}) {
      for (ThreadPool* pool : {&two, &three}) {
        std::vector<float> y(m * n);
        Gemm(x.data(), m, k, packed.matrix(), nullptr, y.data(), n, *pool);
        ASSERT_TRUE(std::equal(y.begin(), y.end(), expected.begin()))
            << "m=" << m << " threads=" << pool->num_threads();
      }
    }
  }
}

// Float weights run 16-lane FMAs where the CPU has AVX-512 (all but decode's streams, m <= 12):
// each lane the 8-lane kernel's operations in the same order, for weights packed per call,
// panels read in place (m = 13, 32) and panels converted (prefill, m = 70).
TEST(GemmTest, PanelKernelsGiveTheSameBitsOnAvx512AndAvx2) {
  if (!internal::UseAvx512PanelKernels(true)) GTEST_SKIP() << "this CPU has no AVX-512";
  std::mt19937 rng(8);
  const int64_t n = 150, k = 515;
  ThreadPool pool(2);
  for (DType dtype : kDTypes) {
    SCOPED_TRACE(DTypeName(dtype));
    const std::vector<uint8_t> stored = RandomWeights(dtype, n, k, rng);
    const WeightMatrix w{stored.data(), dtype, n, k};
    const Packed packed(w, pool);
    for (const WeightMatrix* matrix : {&w, &packed.matrix()}) {
      for (int64_t m : {1, 2, 7, 13, 32, 70}) {
        std::vector<float> x = RandomVector(m * k, rng), wide(m * n), narrow(m * n);
        ASSERT_TRUE(internal::UseAvx512PanelKernels(true));
        internal::GemmTiled(x.data(), m, k, *matrix, nullptr, wide.data(), n, pool);
        internal::UseAvx512PanelKernels(false);
        internal::GemmTiled(x.data(), m, k, *matrix, nullptr, narrow.data(), n, pool);
        internal::UseAvx512PanelKernels(true);
        ASSERT_EQ(wide, narrow) << (matrix == &w ? "row-major" : "panels") << " m=" << m;
      }
    }
  }
}

TEST(GemmTest, ReadRowReadsEitherLayout) {
  std::mt19937 rng(6);
  ThreadPool pool(2);
  const int64_t n = 37, k = 21;
  for (DType dtype : kDTypes) {
    const std::vector<uint8_t> stored = RandomWeights(dtype, n, k, rng);
    std::vector<float> rounded(n * k);
    ToFloat(dtype, stored.data(), rounded.data(), rounded.size());
    const WeightMatrix w{stored.data(), dtype, n, k};
    const Packed packed(w, pool);
    std::vector<float> row(k), packed_row(k);
    for (int64_t r = 0; r < n; ++r) {
      ReadRow(w, r, row.data());
      ReadRow(packed.matrix(), r, packed_row.data());
      const std::vector<float> want(rounded.begin() + r * k, rounded.begin() + (r + 1) * k);
      ASSERT_EQ(row, want) << DTypeName(dtype) << " row " << r;
      ASSERT_EQ(packed_row, want) << DTypeName(dtype) << " row " << r;
    }
  }
}

TEST(GemmTest, MultiEqualsSeparateProducts) {
  ThreadPool pool(2);
  std::mt19937 rng(11);
  const int64_t k = 72;
  const std::vector<std::pair<int64_t, DType>> shapes = {
      {37, DType::kBF16}, {5, DType::kF32}, {1600, DType::kF16}};
  std::vector<std::vector<uint8_t>> weights;
  std::vector<std::vector<float>> biases;
  for (const auto& [n, dt] : shapes) {
    std::vector<float> w = RandomVector(n * k, rng);
    weights.emplace_back(n * k * DTypeSize(dt));
    FromFloat(dt, w.data(), weights.back().data(), w.size());
    biases.push_back(RandomVector(n, rng));
  }
  std::vector<Packed> packed;
  for (size_t i = 0; i < shapes.size(); ++i) {
    packed.emplace_back(WeightMatrix{weights[i].data(), shapes[i].second, shapes[i].first, k},
                        pool);
  }
  for (bool panels : {false, true}) {
    for (int64_t m : {1, 3, 17, 60}) {
      std::vector<float> x = RandomVector(m * k, rng);
      std::vector<std::vector<float>> multi, single;
      std::vector<GemmOutput> outs;
      for (size_t i = 0; i < shapes.size(); ++i) {
        const auto [n, dt] = shapes[i];
        multi.emplace_back(m * n, -1.0f);
        single.emplace_back(m * n, -2.0f);
        const WeightMatrix w =
            panels ? packed[i].matrix() : WeightMatrix{weights[i].data(), dt, n, k};
        outs.push_back({w, i == 1 ? nullptr : biases[i].data(), multi.back().data(), n});
        Gemm(x.data(), m, k, w, outs.back().bias, single.back().data(), n, pool);
      }
      GemmMulti(x.data(), m, k, outs, pool);
      for (size_t i = 0; i < shapes.size(); ++i) {
        EXPECT_EQ(multi[i], single[i]) << "m=" << m << " panels=" << panels;
      }
    }
  }
}

TEST(GemmTest, HonoursRowStrides) {
  ThreadPool pool(2);
  for (DType dtype : kDTypes) {
    for (int64_t m : {1, 3, 8, 40}) {
      CheckGemm({m, 45, 70, 77, 51, dtype, true}, Gemm, pool, 7);
      CheckGemm({m, 45, 70, 77, 51, dtype, false}, internal::GemmTiled, pool, 8);
      CheckGemm({m, 45, 70, 77, 51, dtype, false}, internal::GemmStreaming, pool, 9);
      CheckGemm({m, 45, 70, 77, 51, dtype, true}, GemmOnPanels, pool, 10);
    }
  }
}

TEST(GemmTest, SingleThreadLargeMSmallN) {
  // Few panels and many rows: the tiled path splits M across threads instead of N.
  ThreadPool one(1);
  ThreadPool three(3);
  CheckGemm({130, 10, 300, 300, 10, DType::kBF16, true}, Gemm, one, 11);
  CheckGemm({130, 10, 300, 300, 10, DType::kBF16, true}, Gemm, three, 12);
}

TEST(GemmTest, EmptyKGivesBias) {
  ThreadPool pool(2);
  std::vector<float> bias = {1.5f, -2.0f, 3.0f};
  std::vector<float> y(6, 0.0f);
  uint16_t dummy = 0;
  WeightMatrix w{&dummy, DType::kBF16, 3, 0};
  Gemm(nullptr, 2, 0, w, bias.data(), y.data(), 3, pool);
  EXPECT_EQ(y, (std::vector<float>{1.5f, -2.0f, 3.0f, 1.5f, -2.0f, 3.0f}));
}

}  // namespace
}  // namespace tandem::kernels
