// The backend seam: device parsing and selection (every build), the KV addressing the CUDA
// kernels use checked against KvLayout (every build), and every CUDA operation checked against
// the CPU backend on the same inputs (label cuda: skipped where no GPU is present).

#include "common/kernels/backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/kernels/backend_factory.h"
#include "common/kernels/cpu/cpu_backend.h"
#include "common/kernels/cuda/kv_addressing.h"
#include "common/kv/kv_rows.h"
#include "common/util/dtype.h"
#include "common/util/thread_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::kernels {
namespace {

using ::testing::HasSubstr;

TEST(DeviceSpecTest, ParsesCpuCudaAndOrdinals) {
  EXPECT_EQ(ParseDevice("cpu").value(), DeviceSpec{});
  EXPECT_EQ(ParseDevice("cuda").value(), (DeviceSpec{.kind = DeviceSpec::Kind::kCuda}));
  EXPECT_EQ(ParseDevice("cuda:3").value(),
            (DeviceSpec{.kind = DeviceSpec::Kind::kCuda, .index = 3}));
  EXPECT_EQ(ParseDevice("cuda:3").value().ToString(), "cuda:3");
  for (const char* bad :
       {"", "gpu", "CUDA", "cuda:", "cuda:-1", "cuda:1x", "cuda:99999", "cpu:0"}) {
    const auto parsed = ParseDevice(bad);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(parsed.status().message(), HasSubstr("expected cpu, cuda or cuda:N"));
  }
}

TEST(BackendFactoryTest, CpuAlwaysAndCudaOnlyWithADevice) {
  ThreadPool pool(2);
  auto cpu = CreateBackend(DeviceSpec{}, pool);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_TRUE((*cpu)->host_addressable());
  EXPECT_THAT((*cpu)->Describe(), HasSubstr("cpu (2 threads)"));

  auto cuda = CreateBackend(DeviceSpec{.kind = DeviceSpec::Kind::kCuda, .index = 1000}, pool);
  ASSERT_FALSE(cuda.ok());
  EXPECT_EQ(cuda.status().code(), absl::StatusCode::kFailedPrecondition);
  if (CudaBackendBuilt()) {
    // No driver, no GPU, or not that many GPUs: each is named.
    EXPECT_THAT(cuda.status().message(), HasSubstr("cuda:1000"));
  } else {
    EXPECT_THAT(cuda.status().message(), HasSubstr("built without the CUDA backend"));
  }
}

TEST(KvAddressingTest, MatchesKvLayoutForEveryDtypeAndMixedPools) {
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16, DType::kI8}) {
    kv::KvLayout layout{
        .num_layers = 3, .num_kv_heads = 2, .head_dim = 24, .block_size = 5, .dtype = dtype};
    std::vector<kv::KvArena> arenas = {
        {.base = reinterpret_cast<uint8_t*>(4096), .layout = layout}};
    if (dtype == DType::kF16) {
      kv::KvLayout narrow = layout;
      narrow.dtype = DType::kI8;
      arenas.push_back({.base = reinterpret_cast<uint8_t*>(4096),
                        .layout = layout,
                        .num_wide = 3,
                        .narrow = narrow});
    }
    for (const kv::KvArena& arena : arenas) {
      const cuda::KvPool pool = cuda::PoolOf(arena);
      for (int64_t block : {0, 2, 3, 6}) {
        for (int layer = 0; layer < layout.num_layers; ++layer) {
          for (int head = 0; head < layout.num_kv_heads; ++head) {
            for (bool value : {false, true}) {
              for (int slot = 0; slot < layout.block_size; ++slot) {
                const kv::KvLayout& own = arena.LayoutOf(block);
                const kv::KvRowRef ref{layer, head, value, slot};
                const cuda::KvRowAddress a = cuda::LocateRow(pool, block, layer, head, value, slot);
                SCOPED_TRACE(absl::StrCat(std::string(DTypeName(dtype)), " block ", block,
                                          " layer ", layer));
                EXPECT_EQ(a.row, arena.Block(block) + kv::KvRowOffset(own, ref));
                EXPECT_EQ(a.dtype, own.dtype);
                if (own.dtype == DType::kI8) {
                  EXPECT_EQ(a.scale, arena.Block(block) + kv::KvScaleOffset(own, ref));
                } else {
                  EXPECT_EQ(a.scale, nullptr);
                }
              }
            }
          }
        }
      }
    }
  }
}

// ---- CUDA against CPU ----

std::vector<float> Random(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// Backend memory holding a copy of host data, freed with the holder.
class DeviceCopy {
 public:
  DeviceCopy(Backend& b, const void* host, size_t bytes) : b_(b), bytes_(bytes) {
    p_ = b.Allocate(bytes).value();
    if (bytes > 0) b.CopyFromHost(p_, host, bytes);
  }
  template <typename T>
  DeviceCopy(Backend& b, const std::vector<T>& v) : DeviceCopy(b, v.data(), v.size() * sizeof(T)) {}
  ~DeviceCopy() { b_.Free(p_); }
  float* f() const { return static_cast<float*>(p_); }
  uint8_t* bytes() const { return static_cast<uint8_t*>(p_); }
  template <typename T>
  std::vector<T> Read() const {
    std::vector<T> out(bytes_ / sizeof(T));
    b_.CopyToHost(out.data(), p_, bytes_);
    return out;
  }

 private:
  Backend& b_;
  void* p_;
  size_t bytes_;
};

// Both backends, and a tolerance check scaled to the reference's spread.
class CudaParityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto cuda = CreateBackend(DeviceSpec{.kind = DeviceSpec::Kind::kCuda}, pool_);
    if (!cuda.ok()) GTEST_SKIP() << "no CUDA device: " << cuda.status().message();
    gpu_ = std::move(*cuda);
  }
  void TearDown() override {
    if (gpu_ != nullptr) {
      EXPECT_TRUE(gpu_->Finish().ok());
    }
  }

  // |got - want| <= tol * max(1, std(want)) elementwise.
  static void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, double tol,
                          const std::string& what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    double mean = 0, var = 0;
    for (float w : want) mean += w;
    mean /= std::max<size_t>(want.size(), 1);
    for (float w : want) var += (w - mean) * (w - mean);
    const double spread = std::max(1.0, std::sqrt(var / std::max<size_t>(want.size(), 1)));
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      if (!(std::fabs(got[i] - want[i]) <= tol * spread)) {
        if (bad++ == 0) first = i;
      }
    }
    EXPECT_EQ(bad, 0u) << what << ": first mismatch at " << first << ": " << got[first] << " vs "
                       << want[first];
  }

  ThreadPool pool_{2};
  CpuBackend cpu_{pool_};
  std::unique_ptr<Backend> gpu_;
  std::mt19937 rng_{7};
};

TEST_F(CudaParityTest, ElementwiseOperations) {
  const int64_t rows = 37, dim = 200;
  const std::vector<float> x = Random(rows * dim, rng_), w = Random(dim, rng_, 0.1f);
  DeviceCopy gx(*gpu_, x), gw(*gpu_, w), gy(*gpu_, x);
  std::vector<float> y(x.size());
  cpu_.RmsNorm(x.data(), w.data(), 1e-5f, rows, dim, y.data());
  gpu_->RmsNorm(gx.f(), gw.f(), 1e-5f, rows, dim, gy.f());
  ExpectClose(gy.Read<float>(), y, 1e-5, "RmsNorm");

  const std::vector<float> gate_up = Random(rows * 2 * dim, rng_);
  DeviceCopy ggu(*gpu_, gate_up), gout(*gpu_, std::vector<float>(rows * dim));
  std::vector<float> out(rows * dim);
  cpu_.SiluMul(gate_up.data(), rows, dim, out.data());
  gpu_->SiluMul(ggu.f(), rows, dim, gout.f());
  ExpectClose(gout.Read<float>(), out, 1e-5, "SiluMul");

  std::vector<float> a = x;
  DeviceCopy ga(*gpu_, x), gb(*gpu_, gate_up);
  cpu_.Add(a.data(), gate_up.data(), rows * dim);
  cpu_.Scale(a.data(), 0.75f, rows * dim);
  gpu_->Add(ga.f(), gb.f(), rows * dim);
  gpu_->Scale(ga.f(), 0.75f, rows * dim);
  ExpectClose(ga.Read<float>(), a, 1e-6, "Add, Scale");
}

TEST_F(CudaParityTest, RopeAtLargePositions) {
  const int q_heads = 8, k_heads = 2, hd = 128;
  const int64_t rows = 5;
  const std::vector<int64_t> positions = {0, 1, 17, 4095, 131071};
  std::vector<float> inv_freq(hd / 2);
  for (int j = 0; j < hd / 2; ++j) inv_freq[j] = std::pow(500000.0f, -2.0f * j / hd);
  std::vector<float> q = Random(rows * q_heads * hd, rng_), k = Random(rows * k_heads * hd, rng_);
  DeviceCopy gq(*gpu_, q), gk(*gpu_, k), gf(*gpu_, inv_freq);
  cpu_.Rope(q.data(), q_heads, k.data(), k_heads, hd, rows, positions.data(), inv_freq.data());
  gpu_->Rope(gq.f(), q_heads, gk.f(), k_heads, hd, rows, positions.data(), gf.f());
  ExpectClose(gq.Read<float>(), q, 1e-5, "Rope q");
  ExpectClose(gk.Read<float>(), k, 1e-5, "Rope k");
}

TEST_F(CudaParityTest, EmbedGatherScatter) {
  const int64_t vocab = 50, dim = 33;
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    const std::vector<float> table = Random(vocab * dim, rng_);
    std::vector<uint8_t> stored(table.size() * DTypeSize(dtype));
    FromFloat(dtype, table.data(), stored.data(), table.size());
    const WeightMatrix host{stored.data(), dtype, vocab, dim};
    const WeightMatrix dev = gpu_->ResidentWeight(host).value();
    const std::vector<int32_t> tokens = {3, 49, 0, 3, 17};
    std::vector<float> out(tokens.size() * dim);
    DeviceCopy gout(*gpu_, out);
    cpu_.Embed(host, tokens.data(), 5, out.data());
    gpu_->Embed(dev, tokens.data(), 5, gout.f());
    ExpectClose(gout.Read<float>(), out, 0, absl::StrCat("Embed ", std::string(DTypeName(dtype))));
  }
  const std::vector<float> src = Random(10 * 7, rng_);
  const std::vector<int64_t> rows = {9, 0, 4};
  std::vector<float> gathered(3 * 7), scattered = src;
  DeviceCopy gsrc(*gpu_, src), gg(*gpu_, gathered), gs(*gpu_, src);
  cpu_.GatherRows(src.data(), 7, rows.data(), 3, gathered.data());
  cpu_.ScatterRows(gathered.data(), 7, rows.data(), 3, scattered.data());
  gpu_->GatherRows(gsrc.f(), 7, rows.data(), 3, gg.f());
  gpu_->ScatterRows(gg.f(), 7, rows.data(), 3, gs.f());
  ExpectClose(gg.Read<float>(), gathered, 0, "GatherRows");
  ExpectClose(gs.Read<float>(), scattered, 0, "ScatterRows");
}

// GEMMs of the five architectures' odd and even shapes, each weight dtype, with bias, strided x
// and y, and a GemmMulti sharing one x; bf16/fp16 inputs round x, so the tolerance is theirs.
TEST_F(CudaParityTest, GemmAgainstTheCpuGemm) {
  struct Shape {
    int64_t m, n, k;
  };
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (Shape s :
         {Shape{1, 96, 64}, Shape{7, 130, 200}, Shape{64, 512, 256}, Shape{300, 33, 96}}) {
      const std::vector<float> wf = Random(s.n * s.k, rng_, 0.05f);
      std::vector<uint8_t> stored(wf.size() * DTypeSize(dtype));
      FromFloat(dtype, wf.data(), stored.data(), wf.size());
      const WeightMatrix host{stored.data(), dtype, s.n, s.k};
      const WeightMatrix dev = gpu_->ResidentWeight(host).value();
      const int64_t x_stride = s.k + 3, y_stride = 2 * s.n + 1;
      const std::vector<float> x = Random(s.m * x_stride, rng_), bias = Random(s.n, rng_);
      std::vector<float> y(s.m * y_stride, 0.0f);
      DeviceCopy gx(*gpu_, x), gbias(*gpu_, bias), gy(*gpu_, y);
      const GemmOutput cpu_out[] = {{host, bias.data(), y.data(), y_stride},
                                    {host, nullptr, y.data() + s.n, y_stride}};
      const GemmOutput gpu_out[] = {{dev, gbias.f(), gy.f(), y_stride},
                                    {dev, nullptr, gy.f() + s.n, y_stride}};
      cpu_.GemmMulti(x.data(), s.m, x_stride, cpu_out);
      gpu_->GemmMulti(gx.f(), s.m, x_stride, gpu_out);
      const double tol = dtype == DType::kF32 ? 1e-4 : 2e-2;
      ExpectClose(
          gy.Read<float>(), y, tol,
          absl::StrCat("Gemm ", std::string(DTypeName(dtype)), " ", s.m, "x", s.n, "x", s.k));
    }
  }
}

// A pool with `blocks` blocks of `layout` (or a mixed one), identical bytes on both backends.
struct Pools {
  kv::KvArena host_arena, dev_arena;
  std::vector<uint8_t> host;
  std::unique_ptr<DeviceCopy> dev;
};

Pools MakePools(Backend& gpu, const kv::KvLayout& layout, int64_t blocks, bool mixed) {
  Pools p;
  kv::KvLayout narrow = layout;
  narrow.dtype = DType::kI8;
  const int64_t wide = mixed ? blocks / 2 : blocks;
  const size_t bytes = wide * layout.BlockBytes() + (blocks - wide) * narrow.BlockBytes();
  p.host.assign(bytes, 0);
  p.dev = std::make_unique<DeviceCopy>(gpu, p.host);
  p.host_arena = {.base = p.host.data(), .layout = layout};
  if (mixed) {
    p.host_arena.num_wide = wide;
    p.host_arena.narrow = narrow;
  }
  p.dev_arena = p.host_arena;
  p.dev_arena.base = p.dev->bytes();
  return p;
}

// WriteKv then PagedAttention for prefill chunks and decode tokens of several sequences, GQA and
// MQA, block boundaries, an evicted block, every KV dtype and a mixed pool: the written blocks
// match the CPU's byte for byte (int8 within one step of rounding), and the outputs within
// float tolerance.
TEST_F(CudaParityTest, WriteKvAndPagedAttention) {
  struct Case {
    DType dtype;
    bool mixed;
    int heads, kv_heads, head_dim, block_size;
  };
  const Case cases[] = {{DType::kF32, false, 4, 2, 64, 16}, {DType::kBF16, false, 8, 1, 128, 16},
                        {DType::kF16, false, 6, 3, 80, 7},  {DType::kI8, false, 4, 4, 64, 16},
                        {DType::kF16, true, 8, 2, 128, 16}, {DType::kBF16, false, 32, 8, 64, 32}};
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat(std::string(DTypeName(c.dtype)), c.mixed ? " mixed" : "", " heads ",
                              c.heads, "/", c.kv_heads, " d ", c.head_dim, " bs ", c.block_size));
    const kv::KvLayout layout{.num_layers = 2,
                              .num_kv_heads = c.kv_heads,
                              .head_dim = c.head_dim,
                              .block_size = c.block_size,
                              .dtype = c.dtype};
    // (start_pos, new tokens): a fresh prefill, a chunk after cached tokens, two decodes.
    const std::vector<std::pair<int64_t, int>> seqs = {{0, 45}, {30, 20}, {99, 1}, {5, 1}};
    int64_t blocks_needed = 0;
    for (auto [start, n] : seqs) blocks_needed += (start + n + c.block_size - 1) / c.block_size;
    Pools pools = MakePools(*gpu_, layout, blocks_needed + 2, c.mixed);
    std::vector<std::vector<int32_t>> tables;
    std::vector<int32_t> order(blocks_needed);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng_);  // scattered blocks, wide and narrow mixed
    int64_t next = 0, total = 0;
    for (auto [start, n] : seqs) {
      tables.emplace_back(order.begin() + next,
                          order.begin() + next + (start + n + c.block_size - 1) / c.block_size);
      next += static_cast<int64_t>(tables.back().size());
      total += start + n;
    }
    // Every position's K/V, written as history then as the new tokens, per sequence.
    const int64_t kvw = int64_t{c.kv_heads} * c.head_dim, qw = int64_t{c.heads} * c.head_dim;
    const std::vector<float> k = Random(total * kvw, rng_), v = Random(total * kvw, rng_);
    std::vector<KvWrite> writes;
    int64_t row = 0;
    for (size_t i = 0; i < seqs.size(); ++i) {
      writes.push_back({.row = row,
                        .num_tokens = static_cast<int>(seqs[i].first + seqs[i].second),
                        .start_pos = 0,
                        .block_table = tables[i].data()});
      row += seqs[i].first + seqs[i].second;
    }
    DeviceCopy gk(*gpu_, k), gv(*gpu_, v);
    for (int layer = 0; layer < 2; ++layer) {
      cpu_.WriteKv(k.data(), v.data(), writes, pools.host_arena, layer);
      gpu_->WriteKv(gk.f(), gv.f(), writes, pools.dev_arena, layer);
    }
    const std::vector<uint8_t> written = pools.dev->Read<uint8_t>();
    size_t differing = 0;
    for (size_t i = 0; i < written.size(); ++i) differing += written[i] != pools.host[i];
    if (c.dtype == DType::kI8 || c.mixed) {
      EXPECT_LE(differing, written.size() / 1000) << "int8 rounding differs too often";
    } else {
      EXPECT_EQ(differing, 0u) << "written blocks differ";
    }
    // Attention reads the same bytes on both sides: copy the CPU's pool to the device.
    gpu_->CopyFromHost(pools.dev->bytes(), pools.host.data(), pools.host.size());
    tables[0][1] = kv::kNoBlock;  // a window evicted positions [bs, 2 bs) of the first sequence
    std::vector<AttentionSequence> cpu_seqs, gpu_seqs;
    int64_t tokens = 0;
    for (auto [start, n] : seqs) tokens += n;
    const std::vector<float> q = Random(tokens * qw, rng_);
    std::vector<float> out(tokens * qw, 0.0f);
    DeviceCopy gq(*gpu_, q), gout(*gpu_, out);
    int64_t t = 0;
    for (size_t i = 0; i < seqs.size(); ++i) {
      cpu_seqs.push_back({q.data() + t * qw, out.data() + t * qw, seqs[i].second, seqs[i].first,
                          tables[i].data()});
      gpu_seqs.push_back(
          {gq.f() + t * qw, gout.f() + t * qw, seqs[i].second, seqs[i].first, tables[i].data()});
      t += seqs[i].second;
    }
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    cpu_.PagedAttention(cpu_seqs, c.heads, pools.host_arena, 1, scale);
    gpu_->PagedAttention(gpu_seqs, c.heads, pools.dev_arena, 1, scale);
    ExpectClose(gout.Read<float>(), out, 1e-4, "PagedAttention");
  }
}

}  // namespace
}  // namespace tandem::kernels
