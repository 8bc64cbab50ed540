#pragma once
// oneDNN's matmul as a GEMM provider under the CPU kernels (model.cpu_gemm): the own kernels'
// contract (kernels/cpu/gemm.h), with weights prepacked once at load into oneDNN's blocked
// layout (WeightLayout::kOnednn).
//
// Batch invariance: the weights are packed in slices of kOnednnSliceRows output rows, and each
// slice is multiplied by at most kOnednnChunkRows rows of x per call, one thread per call (the
// calling pool thread; oneDNN's own OpenMP threading is off in it). A row's result then comes
// from one of 16 primitives (1..16 rows). At the first use of a shape (K, dtype), the plan
// checks on random data that every one of them gives a row the same bits as the 16-row
// primitive, at any position within the call; a row count that does not is padded to 16, and a
// shape whose 16-row primitive itself depends on the row's position is refused.
//
// On an AMX CPU, bf16 slices in oneDNN's AMX layout are multiplied by Tandem's own AMX tile
// kernel instead (oneDNN picks a non-AMX kernel with other bits for 1-4 rows, which would have
// to be padded; tile loads need a software prefetch to stream weights at the memory's rate). It
// accumulates in the order oneDNN's AMX brgemm does, and the plan checks per row count that it
// gives the 16-row primitive's bits; a count that does not stays on the primitives.
//
// bf16 weights multiply x rounded to bf16 (oneDNN's bf16 matmul, AVX512-BF16 or AMX); f32
// weights multiply f32 x; results accumulate in f32 either way. f16 and quantized weights stay
// on the own kernels.

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/kernels/kernel_types.h"
#include "common/util/dtype.h"
#include "common/util/thread_pool.h"

namespace tandem::kernels {

// model.cpu_gemm: which GEMMs the CPU backend runs.
enum class CpuGemm { kAuto, kTandem, kOnednn };

// "auto" | "tandem" | "onednn"; InvalidArgument naming them otherwise.
absl::StatusOr<CpuGemm> ParseCpuGemm(std::string_view name);
std::string_view CpuGemmName(CpuGemm gemm);

// What oneDNN reports about this CPU.
struct OnednnCpu {
  std::string isa;    // the ISA oneDNN dispatches to: "avx512_core_amx", "avx2", ...
  bool amx = false;   // a matrix engine (AMX tiles for bf16 and int8)
  bool bf16 = false;  // bf16 dot products in hardware (AVX512-BF16 or AMX)
};
const OnednnCpu& OnednnCpuInfo();

// The provider that `requested` means for matrices of `dtype` on this CPU, and why, in words
// for the load log line and `model-inspect info`. kAuto takes oneDNN for bf16 and f16 weights
// where the CPU has bf16 dot products (AVX512-BF16 or AMX), the own kernels otherwise (measured
// faster on AVX2 for f32 weights too: docs/benchmarks.md).
struct CpuGemmChoice {
  CpuGemm gemm = CpuGemm::kTandem;
  std::string reason;
};
absl::StatusOr<CpuGemmChoice> ChooseCpuGemm(CpuGemm requested, DType dtype);

// The dtype oneDNN multiplies weights of `weights` in: f32 and bf16 as they are; f16 (oneDNN 2.6
// has no f16 matmul short of AVX512-FP16) rounded to bf16 where the CPU has bf16 dot products,
// else widened to f32, which is exact. PackOnednn converts; the packed view has this dtype.
DType OnednnPackDType(DType weights);

inline constexpr int64_t kOnednnSliceRows = 64;
inline constexpr int64_t kOnednnChunkRows = 16;

// A matrix packed for oneDNN: the view the GEMM reads, and what keeps its per-slice oneDNN
// memory objects alive (hold it as long as the view is used).
struct OnednnMatrix {
  WeightMatrix view;
  std::shared_ptr<const void> owner;
};

// Bytes PackOnednn needs for a `rows` x `cols` matrix of `dtype` (f32, bf16 or f16), creating
// the shape's plan if it is new; InvalidArgument for another dtype or a shape oneDNN refuses.
absl::StatusOr<int64_t> OnednnBytes(DType dtype, int64_t rows, int64_t cols);

// Packs row-major `w` (f32, bf16, or f16 converted to OnednnPackDType) into `out` (OnednnBytes
// bytes, 64-byte aligned); slices are split over `pool`.
absl::StatusOr<OnednnMatrix> PackOnednn(const WeightMatrix& w, void* out, ThreadPool& pool);

// The oneDNN implementation a plan of this shape runs ("brg:avx512_core_amx_bf16").
std::string OnednnImplementation(const WeightMatrix& w);

namespace internal {

// Gemm/GemmMulti over kOnednn matrices (every output's w.cols equal, one dtype).
void GemmOnednn(const float* x, int64_t m, int64_t x_stride, std::span<const GemmOutput> outputs,
                ThreadPool& pool);

// Tests: pads every call's rows to kOnednnChunkRows, the path a row count takes when its plan's
// check fails, whether or not it did.
void PadOnednnCalls(bool pad);

// Benchmarks: false runs the AMX tiles one chunk of rows a pass, as before pairs (x row-major,
// TileRows only); true (the default) takes pairs wherever the plan checked them.
void PairOnednnChunks(bool pair);

// Tests: prefill on the AMX tiles in blocks of x's rows of at most `x_bytes` and ranges of at
// most `k_blocks` blocks of 32 input columns (small ones make small shapes take several of
// each); 0 restores the default.
void SetTileBlocking(int64_t x_bytes, int64_t k_blocks);

// "1-4 rows run padded to 16: brg:avx512_core_bf16 gives other bits" for a plan whose row
// counts 1-4 (run_rows[r] != r) run on the 16-row primitive because their own primitive
// (impls[r]) failed the check; "" when every count runs as itself. impls[kOnednnChunkRows] is
// the 16-row primitive's implementation.
std::string DescribeRowPadding(std::span<const int64_t, kOnednnChunkRows + 1> run_rows,
                               std::span<const std::string, kOnednnChunkRows + 1> impls);

// Row `row` of a kOnednn matrix as f32 (ReadRow's contract).
void ReadOnednnRow(const WeightMatrix& w, int64_t row, float* out);

}  // namespace internal
}  // namespace tandem::kernels
