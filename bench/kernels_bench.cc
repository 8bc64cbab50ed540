// Benchmarks of the CPU kernels at Llama-3.2-1B-like shapes. GEMV results report weight bytes
// per second, to be compared with BM_MemoryRead (the machine's plain read bandwidth); GEMM
// results report FLOP/s. Threads: TANDEM_NUM_THREADS or all cores (DefaultThreadPool).
//
//   ./build/bench/kernels_bench --benchmark_min_time=0.1

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "common/kernels/cpu/attention.h"
#include "common/kernels/cpu/attention_tile.h"
#include "common/kernels/cpu/elementwise.h"
#include "common/kernels/cpu/gemm.h"
#include "common/kernels/cpu/gemm_internal.h"
#include "common/kernels/cpu/int8_tiles.h"
#include "common/kernels/cpu/onednn_gemm.h"
#include "common/kernels/cpu/quant_pack.h"
#include "common/kv/kv_layout.h"
#include "common/util/dtype.h"
#include "common/util/thread_pool.h"

namespace tandem::kernels {
namespace {

std::vector<float> RandomFloats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& f : v) f = dist(rng);
  return v;
}

// bf16 weights filled with a cheap pattern (every page written, so none is the shared zero page).
std::vector<uint16_t> Bf16Weights(int64_t n) {
  std::vector<uint16_t> w(n);
  for (int64_t i = 0; i < n; ++i) w[i] = F32ToBf16(static_cast<float>((i * 7919) % 1000) * 1e-3f);
  return w;
}

void BM_MemoryRead(benchmark::State& state) {
  const size_t bytes = size_t{1} << 30;
  std::vector<float> buf(bytes / sizeof(float), 1.0f);
  ThreadPool& pool = DefaultThreadPool();
  const int64_t n = static_cast<int64_t>(buf.size());
  for (auto _ : state) {
    std::vector<float> partial(pool.num_threads(), 0.0f);
    pool.ParallelFor(n, 1 << 20, [&](int64_t b, int64_t e) {
      __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                       _mm256_setzero_ps()};
      for (int64_t i = b; i + 32 <= e; i += 32) {
        for (int u = 0; u < 4; ++u) {
          acc[u] = _mm256_add_ps(acc[u], _mm256_loadu_ps(buf.data() + i + 8 * u));
        }
      }
      alignas(32) float out[8];
      _mm256_store_ps(out,
                      _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
      partial[b * pool.num_threads() / n] = std::accumulate(out, out + 8, 0.0f);
    });
    benchmark::DoNotOptimize(partial.data());
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(bytes));
  state.counters["threads"] = pool.num_threads();
}
BENCHMARK(BM_MemoryRead)->Unit(benchmark::kMillisecond)->UseRealTime();

// Which kernels run int8 activations (paths 7-9): TANDEM_BENCH_A8=vnni (the default where the CPU
// has AVX512-VNNI), avx-vnni (the AVX2 integer kernels on AVX-VNNI), avx2 (the AVX2 integer
// kernels) or float; TANDEM_BENCH_AVX2_ONLY=1 also keeps the float quantized kernels and the
// float panel kernels on AVX2, as on a CPU without AVX-512.
void SelectA8Kernels() {
  static const bool selected = [] {
    const char* env = std::getenv("TANDEM_BENCH_A8");
    const std::string want = env ? env : "vnni";
    internal::UseVnniQuantKernels(want == "vnni");
    internal::UseAvx2IntegerQuantKernels(want == "avx2" || want == "avx-vnni");
    internal::UseAvxVnniIntegerQuantKernels(want == "avx-vnni");
    const char* avx2_only = std::getenv("TANDEM_BENCH_AVX2_ONLY");
    internal::UseAvx512QuantKernels(avx2_only == nullptr || std::string(avx2_only) != "1");
    internal::UseAvx512PanelKernels(avx2_only == nullptr || std::string(avx2_only) != "1");
    return true;
  }();
  (void)selected;
}

// Args: m, n, k, path (0: Gemm dispatch, 1: streaming, 2: tiled, 3: Gemm on weights packed into
// panels, as `model.weight_memory: hugepages` loads them; 4: quantized to int8 per row, 5: to
// int4 in groups of 128, 6: int4 groups of 32, as `model.weight_quantization` loads them; 7-9:
// 4-6 with x rounded to int8 in blocks of 32, as `model.activation_quantization: int8`; 10:
// oneDNN's matmul on weights prepacked at load, as `model.cpu_gemm: onednn`, which on an AMX CPU
// runs Tandem's own AMX tile kernel; 11: 10 with every call on oneDNN's 16-row primitive, as
// oneDNN alone would run it there; 12: 10 with the tiles one chunk of 16 rows a pass, as before
// two chunks shared each weight tile; 13: int8 per row with x rounded to int8 per token, as
// `model.activation_quantization: int8-token` on the own integer kernels (model.cpu_gemm:
// tandem); 14: 13 on the AMX-INT8 tiles (WeightLayout::kInt8Tiles, model.cpu_gemm: auto on an
// AMX CPU); 15: 14 one chunk of 16 rows a pass, x row-major; TANDEM_BENCH_VNNI_ROWS=R runs
// calls of up to R rows on vpdpbusd). bf16 weights.
// Iterations
// rotate over copies of W that together exceed the last-level cache, so every call reads its
// weights from memory as a model's forward pass does (a single small W would stay in L3).
void RunGemm(benchmark::State& state) {
  SelectA8Kernels();
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  const int64_t path = state.range(3);
  // TANDEM_BENCH_HOT=1 keeps one copy, which stays in the caches: the kernel's compute ceiling.
  const char* hot = std::getenv("TANDEM_BENCH_HOT");
  const int64_t kColdBytes = hot != nullptr && std::string(hot) == "1" ? 0 : int64_t{96} << 20;
  const bool onednn = path >= 10 && path <= 12;
  const bool a8_token = path >= 13 && path <= 15, tiles = path == 14 || path == 15;
  const int64_t weights = onednn ? 3 : a8_token ? 4 : path >= 7 ? path - 3 : path;
  QuantFormat quant = weights == 4   ? QuantFormat{8, -1, false}
                      : weights == 5 ? QuantFormat{4, 128, false}
                                     : QuantFormat{4, 32, false};
  if (path >= 7 && path <= 9) quant.int8_activations = true, quant.activation_block = 32;
  if (a8_token) quant.int8_activations = true, quant.activation_block = 0;
  if (tiles && !Int8TilesFit(quant, k)) {
    state.SkipWithError("no AMX-INT8 tiles on this CPU");
    return;
  }
  const char* vnni_rows = std::getenv("TANDEM_BENCH_VNNI_ROWS");
  if (vnni_rows != nullptr) internal::SetInt8VnniRows(std::atoi(vnni_rows));
  const bool quantized = weights >= 4;
  const int64_t quant_bytes = tiles ? Int8TilesBytes(n, k) : QuantPanelBytes(quant, n, k);
  // Counted in the bytes a call reads: quantized copies are smaller.
  const int64_t copy_bytes = quantized ? quant_bytes : n * k * 2;
  const int64_t copies = std::max<int64_t>(1, (kColdBytes + copy_bytes - 1) / copy_bytes);
  std::vector<uint16_t> w = Bf16Weights(copies * n * k);
  std::vector<float> x = RandomFloats(m * k, 1);
  std::vector<float> y(m * n);
  ThreadPool& pool = DefaultThreadPool();
  std::vector<WeightMatrix> matrices;
  const int64_t panel_elems = PanelBytes(DType::kBF16, n, k) / 2;
  std::vector<uint16_t> panels(path == 3 ? copies * panel_elems + 16 : 0);
  std::vector<uint8_t> packed(quantized ? copies * quant_bytes + 64 : 0);
  const int64_t onednn_bytes = onednn ? OnednnBytes(DType::kBF16, n, k).value_or(0) : 0;
  if (onednn) packed.resize(copies * onednn_bytes + 64);
  auto* packed_base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(packed.data()) + 63) &
                                                 ~uintptr_t{63});
  std::vector<OnednnMatrix> onednn_matrices;
  for (int64_t c = 0; c < copies; ++c) {
    matrices.push_back({w.data() + c * n * k, DType::kBF16, n, k});
    if (quantized) {
      matrices.back() =
          tiles ? PackInt8Tiles(quant, DType::kBF16, n, k, QuantizedRows(matrices.back(), quant),
                                packed_base + c * quant_bytes, pool)
                : QuantizeToPanels(matrices.back(), quant, packed_base + c * quant_bytes, pool);
    }
    if (onednn) {
      auto m = PackOnednn(matrices.back(), packed_base + c * onednn_bytes, pool);
      if (!m.ok()) {
        state.SkipWithError(std::string(m.status().message()).c_str());
        return;
      }
      matrices.back() = m->view;
      onednn_matrices.push_back(std::move(*m));
    }
    if (path != 3) continue;
    // 32-byte aligned, as the loader's arena gives.
    auto* aligned = reinterpret_cast<uint16_t*>((reinterpret_cast<uintptr_t>(panels.data()) + 31) &
                                                ~uintptr_t{31});
    matrices.back() = PackPanels(matrices.back(), aligned + c * panel_elems, pool);
  }
  internal::PadOnednnCalls(path == 11);
  internal::PairOnednnChunks(path != 12);
  internal::PairInt8Chunks(path != 15);
  int64_t iteration = 0;
  for (auto _ : state) {
    const WeightMatrix& wm = matrices[iteration++ % copies];
    if (path == 1) {
      internal::GemmStreaming(x.data(), m, k, wm, nullptr, y.data(), n, pool);
    } else if (path == 2) {
      internal::GemmTiled(x.data(), m, k, wm, nullptr, y.data(), n, pool);
    } else {
      Gemm(x.data(), m, k, wm, nullptr, y.data(), n, pool);
    }
    benchmark::DoNotOptimize(y.data());
  }
  internal::PadOnednnCalls(false);
  internal::PairOnednnChunks(true);
  internal::PairInt8Chunks(true);
  state.SetBytesProcessed(state.iterations() * MatrixBytes(matrices.front()));
  state.counters["FLOPS"] = benchmark::Counter(static_cast<double>(2 * m * n * k),
                                               benchmark::Counter::kIsIterationInvariantRate);
}

void BM_GemmDecode(benchmark::State& state) { RunGemm(state); }
BENCHMARK(BM_GemmDecode)
    ->ArgNames({"m", "n", "k", "path"})
    ->ArgsProduct({{1, 8, 32}, {2048}, {2048}, {0}})
    ->ArgsProduct({{1, 8, 32}, {8192}, {2048}, {0}})
    ->ArgsProduct({{1, 8, 32}, {2048}, {8192}, {0}})
    ->ArgsProduct({{1, 8, 32}, {128256}, {2048}, {0}})
    ->ArgsProduct({{1, 8, 32}, {2048, 8192}, {2048}, {3}})
    ->ArgsProduct({{1, 8, 32}, {2048}, {8192}, {3}})
    ->ArgsProduct({{1, 8, 32}, {128256}, {2048}, {3}})
    ->ArgsProduct({{1, 8, 32}, {8192}, {2048}, {4, 5, 6, 7, 8, 9}})
    ->ArgsProduct({{1, 8}, {2048}, {8192}, {4, 5, 6, 7, 8, 9}})
    ->ArgsProduct({{1}, {512, 2048}, {2048}, {3, 4, 5, 6, 7, 8, 9}})
    ->ArgsProduct({{1}, {768, 1280, 4096}, {768}, {3, 8}})
    ->ArgsProduct({{1}, {768}, {2048}, {3, 8}})
    // The heads: 125M (32000 x 768) and 1B (128256 x 2048) in bf16 and int8 per row
    // (model.lm_head_quantization), with float and int8 activations.
    ->ArgsProduct({{1}, {32000}, {768}, {3, 4, 7}})
    ->ArgsProduct({{1}, {128256}, {2048}, {4, 7}})
    ->ArgsProduct({{1, 8, 32}, {2048, 8192}, {2048}, {10, 11, 12}})
    ->ArgsProduct({{1, 8, 32}, {2048}, {8192}, {10, 11, 12}})
    ->ArgsProduct({{1, 32}, {128256}, {2048}, {10}})
    ->ArgsProduct({{1, 8, 32}, {8192}, {2048}, {13, 14, 15}})
    ->ArgsProduct({{1, 8, 32}, {2048}, {8192}, {13, 14, 15}})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

void BM_GemmPrefill(benchmark::State& state) { RunGemm(state); }
BENCHMARK(BM_GemmPrefill)
    ->ArgNames({"m", "n", "k", "path"})
    ->Args({512, 2048, 2048, 0})
    ->Args({512, 8192, 2048, 0})
    ->Args({512, 2048, 2048, 3})
    ->Args({512, 8192, 2048, 3})
    ->Args({512, 8192, 2048, 4})
    ->Args({512, 8192, 2048, 5})
    ->Args({512, 8192, 2048, 6})
    ->Args({512, 8192, 2048, 7})
    ->Args({512, 8192, 2048, 8})
    ->Args({512, 8192, 2048, 9})
    ->Args({512, 2048, 2048, 10})
    ->Args({512, 8192, 2048, 10})
    ->Args({512, 2048, 8192, 10})
    ->Args({512, 2048, 2048, 11})
    ->Args({512, 8192, 2048, 11})
    ->Args({512, 2048, 8192, 11})
    ->Args({512, 2048, 2048, 12})
    ->Args({512, 8192, 2048, 12})
    ->Args({512, 2048, 8192, 12})
    ->Args({512, 2048, 8192, 3})
    ->ArgsProduct({{512}, {2048, 8192}, {2048}, {13, 14, 15}})
    ->Args({512, 2048, 8192, 13})
    ->Args({512, 2048, 8192, 14})
    ->Args({512, 2048, 8192, 15})
    // The 125M shape's FFN at prefill-512 and -2048: x (768 KiB, 3 MiB, 12 MiB) in or out of L2.
    ->ArgsProduct({{512, 2048}, {3072}, {768}, {10}})
    ->ArgsProduct({{512, 2048}, {768}, {3072}, {10}})
    ->ArgsProduct({{2048}, {2048, 8192}, {2048}, {14}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Both strategies around the dispatch threshold, to tune kDecodeMaxM. The weights (64 MiB)
// exceed the last-level cache, as a model's do in a decode step.
void BM_GemmPaths(benchmark::State& state) { RunGemm(state); }
BENCHMARK(BM_GemmPaths)
    ->ArgNames({"m", "n", "k", "path"})
    ->ArgsProduct({{4, 8, 16, 24, 32, 64}, {8192}, {4096}, {1, 2}})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

struct AttentionShape {
  int heads, kv_heads, head_dim;
};
constexpr AttentionShape k1bHeads{32, 8, 64};      // Llama-3.2-1B
constexpr AttentionShape kBundledHeads{4, 2, 32};  // models/tandem-py-8l

// A batch of `num_seqs` sequences, each `context` tokens long in the cache (bf16, one layer),
// attending `new_tokens` queries at the end of the context. state.range(0) is the path: the f32
// loops on the cache's rows read in place (1) or gathered to f32 first (0), or AMX bf16 tiles
// (2, AttentionMath::kBf16Tiles; 3: the same with one KV head per work item; skipped where the
// CPU has none).
void RunAttention(benchmark::State& state, int num_seqs, int64_t context, int new_tokens,
                  AttentionShape shape = k1bHeads) {
  const int64_t path = state.range(0);
  if (path >= 2 && !internal::AttentionTilesAvailable(shape.head_dim)) {
    state.SkipWithError("no AMX tiles on this CPU");
    return;
  }
  const AttentionMath math = path >= 2 ? AttentionMath::kBf16Tiles : AttentionMath::kF32;
  const int had_heads = internal::MaxItemHeads(path == 3 ? 1 : internal::kMaxItemHeads);
  const bool was_in_place = internal::ReadKvInPlace(path != 0);
  kv::KvLayout layout{1, shape.kv_heads, shape.head_dim, 16, DType::kBF16};
  const int64_t blocks_per_seq = (context + layout.block_size - 1) / layout.block_size;
  std::vector<uint8_t> kv_pool(num_seqs * blocks_per_seq * layout.BlockBytes());
  std::vector<float> kv_f32 = RandomFloats(kv_pool.size() / 2, 2);
  FromFloat(DType::kBF16, kv_f32.data(), kv_pool.data(), kv_f32.size());
  std::vector<int32_t> tables(num_seqs * blocks_per_seq);
  std::iota(tables.begin(), tables.end(), 0);
  std::shuffle(tables.begin(), tables.end(), std::mt19937(3));
  const int64_t q_size = static_cast<int64_t>(new_tokens) * shape.heads * layout.head_dim;
  std::vector<float> q = RandomFloats(num_seqs * q_size, 4);
  std::vector<float> out(q.size());
  std::vector<AttentionSequence> seqs;
  for (int s = 0; s < num_seqs; ++s) {
    seqs.push_back({q.data() + s * q_size, out.data() + s * q_size, new_tokens,
                    context - new_tokens, tables.data() + s * blocks_per_seq});
  }
  ThreadPool& pool = DefaultThreadPool();
  const float scale = 1.0f / std::sqrt(static_cast<float>(shape.head_dim));
  for (auto _ : state) {
    PagedAttention(seqs.data(), num_seqs, shape.heads, kv_pool.data(), layout, 0, scale, pool,
                   math);
    benchmark::DoNotOptimize(out.data());
  }
  internal::ReadKvInPlace(was_in_place);
  internal::MaxItemHeads(had_heads);
  // Causal prefill touches about half the key/query pairs.
  const double pairs = new_tokens == 1 ? static_cast<double>(context)
                                       : 0.5 * new_tokens * static_cast<double>(context);
  state.counters["FLOPS"] = benchmark::Counter(num_seqs * pairs * shape.heads * layout.head_dim * 4,
                                               benchmark::Counter::kIsIterationInvariantRate);
  state.SetBytesProcessed(state.iterations() * num_seqs * context * layout.BytesPerToken());
}

void BM_AttentionDecode(benchmark::State& state) { RunAttention(state, 32, 1024, 1); }
BENCHMARK(BM_AttentionDecode)
    ->ArgName("path")
    ->Arg(1)
    ->Arg(0)
    ->Arg(2)
    ->Arg(3)
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// The bundled model's heads at the decode-heavy serving workload's contexts (prompts ~512,
// outputs ~128) and batch.
void BM_AttentionDecodeBundled(benchmark::State& state) {
  RunAttention(state, 24, 640, 1, kBundledHeads);
}
BENCHMARK(BM_AttentionDecodeBundled)
    ->ArgName("path")
    ->Arg(1)
    ->Arg(0)
    ->Arg(2)
    ->Arg(3)
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

void BM_AttentionPrefill(benchmark::State& state) { RunAttention(state, 1, 512, 512); }
BENCHMARK(BM_AttentionPrefill)
    ->ArgName("path")
    ->Arg(1)
    ->Arg(0)
    ->Arg(2)
    ->Arg(3)
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

void BM_AttentionPrefill2048(benchmark::State& state) { RunAttention(state, 1, 2048, 2048); }
BENCHMARK(BM_AttentionPrefill2048)
    ->ArgName("path")
    ->Arg(1)
    ->Arg(0)
    ->Arg(2)
    ->Arg(3)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Arg "isa": 0 = AVX2, 1 = AVX-512 (the same bits; skipped where the CPU has no AVX-512).
bool ElementwiseIsa(benchmark::State& state, int64_t arg, VectorIsa* isa) {
  *isa = arg == 1 ? VectorIsa::kAvx512 : VectorIsa::kAvx2;
  if (*isa == VectorIsa::kAvx512 && BestVectorIsa() != VectorIsa::kAvx512) {
    state.SkipWithError("this CPU has no AVX-512");
    return false;
  }
  return true;
}

void BM_RmsNorm(benchmark::State& state) {
  const int64_t rows = state.range(0), dim = 2048;
  VectorIsa isa;
  if (!ElementwiseIsa(state, state.range(1), &isa)) return;
  std::vector<float> x = RandomFloats(rows * dim, 5);
  std::vector<float> w = RandomFloats(dim, 6);
  std::vector<float> y(x.size());
  for (auto _ : state) {
    RmsNorm(x.data(), w.data(), 1e-5f, rows, dim, y.data(), isa);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(state.iterations() * rows * dim * 8);
}
BENCHMARK(BM_RmsNorm)->ArgNames({"rows", "isa"})->ArgsProduct({{1, 512}, {0, 1}});

// The 1B shape's FFN (8192), one step's rows or a prefill's.
void BM_SiluMul(benchmark::State& state) {
  const int64_t rows = state.range(0), dim = 8192;
  VectorIsa isa;
  if (!ElementwiseIsa(state, state.range(1), &isa)) return;
  std::vector<float> gate_up = RandomFloats(rows * 2 * dim, 9);
  std::vector<float> out(rows * dim);
  for (auto _ : state) {
    SiluMul(gate_up.data(), rows, dim, out.data(), isa);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations() * rows * dim);
}
BENCHMARK(BM_SiluMul)->ArgNames({"rows", "isa"})->ArgsProduct({{1, 64}, {0, 1}});

// One token's q (32 heads) then k (8 heads) at the same position, as the model calls it.
void BM_Rope(benchmark::State& state) {
  VectorIsa isa;
  if (!ElementwiseIsa(state, state.range(0), &isa)) return;
  std::vector<float> q = RandomFloats(32 * 64, 7);
  std::vector<float> k = RandomFloats(8 * 64, 8);
  std::vector<float> inv_freq(32);
  for (int j = 0; j < 32; ++j) inv_freq[j] = std::pow(500000.0f, -2.0f * j / 64);
  int64_t pos = 0;
  for (auto _ : state) {
    ApplyRope(q.data(), 32, 64, pos, inv_freq.data(), isa);
    ApplyRope(k.data(), 8, 64, pos, inv_freq.data(), isa);
    ++pos;
    benchmark::DoNotOptimize(q.data());
  }
}
BENCHMARK(BM_Rope)->ArgName("isa")->Arg(0)->Arg(1);

}  // namespace
}  // namespace tandem::kernels

BENCHMARK_MAIN();
