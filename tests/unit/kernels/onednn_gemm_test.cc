#include "common/kernels/cpu/onednn_gemm.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "common/kernels/cpu/gemm.h"
#include "common/util/dtype.h"
#include "common/util/thread_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::kernels {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

std::vector<float> RandomVector(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& f : v) f = dist(rng);
  return v;
}

// Row-major weights of `dtype` and their oneDNN packing, in a 64-byte aligned buffer as the
// loader's arena gives.
class OnednnWeights {
 public:
  OnednnWeights(const std::vector<float>& w, DType dtype, int64_t n, int64_t k, ThreadPool& pool)
      : stored_(w.size() * DTypeSize(dtype)) {
    FromFloat(dtype, w.data(), stored_.data(), w.size());
    rounded_.resize(w.size());
    ToFloat(dtype, stored_.data(), rounded_.data(), w.size());
    const WeightMatrix row_major{stored_.data(), dtype, n, k};
    auto bytes = OnednnBytes(dtype, n, k);
    if (!bytes.ok()) {
      status_ = bytes.status();
      return;
    }
    packed_.resize(*bytes + 64);
    auto* aligned = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(packed_.data()) + 63) &
                                               ~uintptr_t{63});
    auto m = PackOnednn(row_major, aligned, pool);
    if (!m.ok()) {
      status_ = m.status();
      return;
    }
    matrix_ = std::move(*m);
  }
  const absl::Status& status() const { return status_; }
  const WeightMatrix& matrix() const { return matrix_.view; }
  const std::vector<float>& rounded() const { return rounded_; }

 private:
  std::vector<uint8_t> stored_, packed_;
  std::vector<float> rounded_;
  OnednnMatrix matrix_;
  absl::Status status_;
};

// oneDNN's bf16 matmul needs AVX-512 (native BF16 or AMX, or emulated on AVX512-F).
bool SkipUnsupported(const OnednnWeights& w) {
  if (w.status().ok()) return false;
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument) << w.status();
  return true;
}

// Products against a double reference over the stored weights and x as the provider reads it
// (rounded to bf16 for bf16 weights): both are exact in f32, so only the f32 accumulation
// differs, relative to sum |x| |w|.
TEST(OnednnGemmTest, MatchesReference) {
  ThreadPool pool(2);
  std::mt19937 rng(3);
  // (n, k): a partial slice, several slices with a tail, odd and long rows.
  const std::pair<int64_t, int64_t> shapes[] = {{1, 1}, {7, 13}, {64, 96}, {200, 515}, {130, 2048}};
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (auto [n, k] : shapes) {
      const std::vector<float> w_f32 = RandomVector(n * k, rng);
      const OnednnWeights w(w_f32, dtype, n, k, pool);
      if (SkipUnsupported(w)) {  // f32 runs everywhere; bf16 needs AVX-512
        ASSERT_NE(dtype, DType::kF32) << w.status();
        std::printf("oneDNN has no %s matmul here: %s\n", std::string(DTypeName(dtype)).c_str(),
                    w.status().ToString().c_str());
        break;
      }
      for (int64_t m : {1, 2, 5, 16, 17, 40}) {
        SCOPED_TRACE(::testing::Message()
                     << DTypeName(dtype) << " m=" << m << " n=" << n << " k=" << k);
        const int64_t x_stride = k + 3, y_stride = n + 2;
        const std::vector<float> x = RandomVector(m * x_stride, rng);
        const std::vector<float> bias = RandomVector(n, rng);
        constexpr float kSentinel = 12345.0f;
        std::vector<float> y(m * y_stride, kSentinel);
        Gemm(x.data(), m, x_stride, w.matrix(), bias.data(), y.data(), y_stride, pool);
        const double tolerance = (k + 16) * std::ldexp(1.0, -24);
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < n; ++j) {
            double ref = bias[j], magnitude = std::abs(ref);
            for (int64_t t = 0; t < k; ++t) {
              float xv = x[i * x_stride + t];
              if (dtype == DType::kBF16) xv = Bf16ToF32(F32ToBf16(xv));
              const double prod = static_cast<double>(xv) * w.rounded()[j * k + t];
              ref += prod;
              magnitude += std::abs(prod);
            }
            ASSERT_NEAR(y[i * y_stride + j], ref, tolerance * magnitude + 1e-6)
                << "at " << i << "," << j;
          }
          for (int64_t j = n; j < y_stride; ++j) ASSERT_EQ(y[i * y_stride + j], kSentinel);
        }
      }
    }
  }
}

// A row's bits do not depend on how many rows share the call, where it sits among them, or the
// thread count: the property that keeps a sequence's logits independent of its batch.
// k = 512 puts bf16 slices in the layout of the own AMX kernel on an AMX CPU (k = 515 does not).
TEST(OnednnGemmTest, RowResultsDoNotDependOnTheBatch) {
  std::mt19937 rng(5);
  const int64_t n = 200, rows = 70;
  ThreadPool two(2), three(3);
  for (auto [dtype, k] :
       {std::pair{DType::kF32, int64_t{515}}, std::pair{DType::kBF16, int64_t{515}},
        std::pair{DType::kBF16, int64_t{512}}}) {
    SCOPED_TRACE(::testing::Message() << DTypeName(dtype) << " k=" << k);
    const std::vector<float> x = RandomVector(rows * k, rng);
    const OnednnWeights w(RandomVector(n * k, rng), dtype, n, k, two);
    if (SkipUnsupported(w)) continue;
    std::vector<float> expected(rows * n);
    Gemm(x.data(), rows, k, w.matrix(), nullptr, expected.data(), n, two);
    for (int64_t m : {1, 2, 3, 5, 7, 12, 13, 16, 17, 32, 49}) {
      for (int64_t first : {int64_t{0}, int64_t{1}, rows - m}) {
        for (ThreadPool* pool : {&two, &three}) {
          std::vector<float> y(m * n);
          Gemm(x.data() + first * k, m, k, w.matrix(), nullptr, y.data(), n, *pool);
          ASSERT_TRUE(std::equal(y.begin(), y.end(), expected.begin() + first * n))
              << "m=" << m << " first row " << first << " threads=" << pool->num_threads();
        }
      }
    }
  }
}

// Padding a call's rows to 16 (what a row count whose bits differed would run) gives the same
// bits, including the padded rows' neighbours. Padded calls always run oneDNN's 16-row
// primitive, so at k = 256 on an AMX CPU this compares the own AMX kernels (one chunk and two
// chunks a pass) with oneDNN's; k = 2112 has the pairs' accumulators wait in y between runs of
// K blocks.
TEST(OnednnGemmTest, PaddedCallsGiveTheSameBits) {
  std::mt19937 rng(6);
  const int64_t n = 130, rows = 37;
  ThreadPool pool(2);
  for (auto [dtype, k] :
       {std::pair{DType::kF32, int64_t{200}}, std::pair{DType::kBF16, int64_t{200}},
        std::pair{DType::kBF16, int64_t{256}}, std::pair{DType::kBF16, int64_t{2112}}}) {
    const std::vector<float> x = RandomVector(rows * k, rng);
    const OnednnWeights w(RandomVector(n * k, rng), dtype, n, k, pool);
    if (SkipUnsupported(w)) continue;
    for (int64_t m : {1, 2, 4, 5, 16, 37}) {
      std::vector<float> plain(m * n), padded(m * n);
      Gemm(x.data(), m, k, w.matrix(), nullptr, plain.data(), n, pool);
      internal::PadOnednnCalls(true);
      Gemm(x.data(), m, k, w.matrix(), nullptr, padded.data(), n, pool);
      internal::PadOnednnCalls(false);
      EXPECT_EQ(plain, padded) << DTypeName(dtype) << " k=" << k << " m=" << m;
    }
  }
}

// Prefill on the AMX tiles runs in blocks of rows and ranges of K (each output's sums waiting in y
// between ranges); whatever the blocking, every row gets the bits oneDNN's 16-row primitive (the
// padded path) gives it. Outputs that are whole slices without bias take ranges; a bias or a
// partial slice keeps all of K in one call. Without AMX this runs the primitives both ways.
TEST(OnednnGemmTest, TileBlocksGiveThePrimitivesBits) {
  std::mt19937 rng(8);
  ThreadPool pool(2);
  struct Case {
    int64_t n, k;
    bool bias;
  };
  for (const Case c : {Case{128, 256, false}, Case{192, 2112, false}, Case{130, 320, false},
                       Case{128, 256, true}}) {
    const std::vector<float> x = RandomVector(300 * c.k, rng);
    const std::vector<float> bias = RandomVector(c.n, rng);
    const OnednnWeights w(RandomVector(c.n * c.k, rng), DType::kBF16, c.n, c.k, pool);
    if (SkipUnsupported(w)) return;
    // (x bytes a block, K blocks a range): the defaults, then blocks of 1-3 pairs and ranges of
    // 1 and 3 blocks.
    for (auto [x_bytes, k_blocks] :
         {std::pair<int64_t, int64_t>{0, 0}, {32 << 10, 3}, {4 << 10, 1}}) {
      internal::SetTileBlocking(x_bytes, k_blocks);
      for (int64_t m : {33, 64, 95, 300}) {
        SCOPED_TRACE(::testing::Message()
                     << "n=" << c.n << " k=" << c.k << " bias=" << c.bias << " x_bytes=" << x_bytes
                     << " k_blocks=" << k_blocks << " m=" << m);
        std::vector<float> tiles(m * c.n), padded(m * c.n);
        const float* b = c.bias ? bias.data() : nullptr;
        Gemm(x.data(), m, c.k, w.matrix(), b, tiles.data(), c.n, pool);
        internal::PadOnednnCalls(true);
        Gemm(x.data(), m, c.k, w.matrix(), b, padded.data(), c.n, pool);
        internal::PadOnednnCalls(false);
        ASSERT_EQ(tiles, padded);
      }
    }
    internal::SetTileBlocking(0, 0);
  }
}

TEST(OnednnGemmTest, MultiEqualsSeparateProducts) {
  ThreadPool pool(2);
  std::mt19937 rng(7);
  const int64_t k = 96, m = 19;
  const OnednnWeights a(RandomVector(130 * k, rng), DType::kF32, 130, k, pool);
  const OnednnWeights b(RandomVector(40 * k, rng), DType::kF32, 40, k, pool);
  ASSERT_TRUE(a.status().ok() && b.status().ok()) << a.status() << b.status();
  const std::vector<float> x = RandomVector(m * k, rng), bias = RandomVector(130, rng);
  std::vector<float> ya(m * 130), yb(m * 40), sa(m * 130), sb(m * 40);
  const GemmOutput outputs[] = {{a.matrix(), bias.data(), ya.data(), 130},
                                {b.matrix(), nullptr, yb.data(), 40}};
  GemmMulti(x.data(), m, k, outputs, pool);
  Gemm(x.data(), m, k, a.matrix(), bias.data(), sa.data(), 130, pool);
  Gemm(x.data(), m, k, b.matrix(), nullptr, sb.data(), 40, pool);
  EXPECT_EQ(ya, sa);
  EXPECT_EQ(yb, sb);
}

TEST(OnednnGemmTest, ReadRowGivesTheStoredRow) {
  ThreadPool pool(2);
  std::mt19937 rng(9);
  const int64_t n = 70, k = 33;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const OnednnWeights w(RandomVector(n * k, rng), dtype, n, k, pool);
    if (SkipUnsupported(w)) continue;
    EXPECT_EQ(MatrixBytes(w.matrix()), *OnednnBytes(dtype, n, k));
    std::vector<float> row(k);
    for (int64_t r : {0, 63, 64, 69}) {
      ReadRow(w.matrix(), r, row.data());
      EXPECT_TRUE(std::equal(row.begin(), row.end(), w.rounded().begin() + r * k))
          << DTypeName(dtype) << " row " << r;
    }
  }
}

TEST(OnednnGemmTest, RefusesWhatItDoesNotRun) {
  ThreadPool pool(1);
  std::vector<uint8_t> i8(64 * 8);
  auto packed = PackOnednn({i8.data(), DType::kI8, 64, 8}, i8.data(), pool);
  ASSERT_FALSE(packed.ok());
  EXPECT_THAT(packed.status().message(),
              HasSubstr("onednn multiplies f32, bf16 and f16 weights, not int8"));
  EXPECT_FALSE(ChooseCpuGemm(CpuGemm::kOnednn, DType::kI8).ok());
  EXPECT_THAT(ParseCpuGemm("mkl").status().message(),
              HasSubstr("model.cpu_gemm must be auto, tandem or onednn, got \"mkl\""));
}

TEST(OnednnGemmTest, DescribesTheRowCountsThatRunPadded) {
  std::array<int64_t, kOnednnChunkRows + 1> run_rows;
  std::array<std::string, kOnednnChunkRows + 1> impls;
  for (int64_t r = 0; r <= kOnednnChunkRows; ++r) {
    run_rows[r] = r;
    impls[r] = "brg:avx512_core_amx_bf16";
  }
  EXPECT_EQ(internal::DescribeRowPadding(run_rows, impls), "");
  // As oneDNN 2.6.3 plans a bf16 slice on an AMX CPU: 1-4 rows take the AVX512-BF16 brgemm.
  for (int64_t r = 1; r <= 4; ++r) {
    run_rows[r] = kOnednnChunkRows;
    impls[r] = "brg:avx512_core_bf16";
  }
  EXPECT_EQ(internal::DescribeRowPadding(run_rows, impls),
            "1-4 rows run padded to 16: brg:avx512_core_bf16 gives other bits");
  run_rows[7] = run_rows[9] = run_rows[10] = kOnednnChunkRows;
  impls[9] = "none";  // no primitive reads the layout at 9 rows
  EXPECT_EQ(internal::DescribeRowPadding(run_rows, impls),
            "1-4, 7, 9-10 rows run padded to 16: brg:avx512_core_bf16 gives other bits");
}

TEST(OnednnGemmTest, TheImplementationNamesItsPadding) {
  ThreadPool pool(2);
  std::mt19937 rng(8);
  const int64_t n = 64, k = 256;
  const OnednnWeights w(RandomVector(n * k, rng), DType::kBF16, n, k, pool);
  if (!w.status().ok()) GTEST_SKIP() << "oneDNN has no bf16 matmul here: " << w.status();
  const std::string impl = OnednnImplementation(w.matrix());
  // With bf16 dot products oneDNN multiplies bf16 in its brgemm; AVX-512 without them
  // (Skylake to Ice Lake, or ONEDNN_MAX_CPU_ISA=AVX512_CORE) emulates bf16 in gemm:jit.
  EXPECT_THAT(impl, StartsWith(OnednnCpuInfo().bf16 ? "brg:" : "gemm:jit"));
  // On AMX every row count runs on the own tile kernel, checked to give the bits of oneDNN's
  // AMX brgemm (whose 1-4-row primitives, on oneDNN 2.6.3, are the AVX512-BF16 brgemm, which
  // accumulates in another order and would have to be padded).
  if (OnednnCpuInfo().amx && impl.find("amx") != std::string::npos) {
    EXPECT_THAT(impl,
                HasSubstr("(1-16 rows on Tandem's AMX tiles, two chunks a pass, the same bits)"));
  }
}

TEST(OnednnGemmTest, AutoTakesOnednnForBf16AndF16WeightsWithBf16Hardware) {
  const bool bf16 = OnednnCpuInfo().bf16;
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    auto choice = ChooseCpuGemm(CpuGemm::kAuto, dtype);
    ASSERT_TRUE(choice.ok());
    const bool onednn = bf16 && dtype != DType::kF32;
    EXPECT_EQ(choice->gemm, onednn ? CpuGemm::kOnednn : CpuGemm::kTandem) << choice->reason;
    EXPECT_THAT(choice->reason, HasSubstr(OnednnCpuInfo().isa));
  }
  EXPECT_EQ(ChooseCpuGemm(CpuGemm::kTandem, DType::kBF16)->gemm, CpuGemm::kTandem);
  EXPECT_EQ(ChooseCpuGemm(CpuGemm::kOnednn, DType::kF32)->gemm, CpuGemm::kOnednn);
  // f16 weights: the reason says what oneDNN multiplies them as.
  auto f16 = ChooseCpuGemm(CpuGemm::kOnednn, DType::kF16);
  ASSERT_TRUE(f16.ok());
  EXPECT_THAT(f16->reason,
              HasSubstr(bf16 ? "f16 weights rounded to bf16" : "f16 weights widened to f32"));
}

// oneDNN 2.6 has no f16 matmul short of AVX512-FP16: f16 weights are packed in OnednnPackDType
// (bf16 with bf16 dot products in hardware, else f32). Values that dtype holds exactly give the
// bits of the same weights stored in it, at every row count, and read back as stored.
TEST(OnednnGemmTest, F16WeightsRunAsTheirPackDType) {
  ThreadPool pool(2);
  std::mt19937 rng(9);
  const DType pack = OnednnPackDType(DType::kF16);
  EXPECT_EQ(pack, OnednnCpuInfo().bf16 ? DType::kBF16 : DType::kF32);
  const int64_t n = 130, k = 512;
  std::vector<float> v = RandomVector(n * k, rng);
  for (float& f : v) {
    // Exact in bf16, and normal in f16, hence exact in f16 and f32 too.
    f = Bf16ToF32(F32ToBf16(std::abs(f) < 0x1p-10f ? 0x1p-10f : f));
  }
  const OnednnWeights as_pack(v, pack, n, k, pool);
  if (SkipUnsupported(as_pack)) {
    GTEST_SKIP() << "oneDNN has no " << DTypeName(pack) << " matmul here: " << as_pack.status();
  }
  const OnednnWeights f16(v, DType::kF16, n, k, pool);
  ASSERT_TRUE(f16.status().ok()) << f16.status();
  ASSERT_EQ(f16.rounded(), v);
  EXPECT_EQ(f16.matrix().dtype, pack);
  EXPECT_EQ(OnednnBytes(DType::kF16, n, k).value(), OnednnBytes(pack, n, k).value());
  std::vector<float> row(k);
  ReadRow(f16.matrix(), 77, row.data());
  EXPECT_TRUE(std::equal(row.begin(), row.end(), v.begin() + 77 * k));
  for (int64_t m : {1, 5, 16, 37}) {
    const std::vector<float> x = RandomVector(m * k, rng);
    std::vector<float> want(m * n), got(m * n);
    Gemm(x.data(), m, k, as_pack.matrix(), nullptr, want.data(), n, pool);
    Gemm(x.data(), m, k, f16.matrix(), nullptr, got.data(), n, pool);
    EXPECT_EQ(got, want) << "m=" << m;
  }
}

}  // namespace
}  // namespace tandem::kernels
