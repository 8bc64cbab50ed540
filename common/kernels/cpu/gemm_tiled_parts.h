#pragma once

// The parts of the blocked GEMM (gemm_tiled.cc) that its quantized-weight kernels share:
// gemm_quant.cc (codes converted to f32 in registers) and gemm_integer.cc (integer dot products
// with x rounded to int8). Internal to common/kernels/cpu.

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "common/kernels/cpu/gemm_internal.h"
#include "common/kernels/cpu/simd_util.h"

namespace tandem::kernels::internal::tiled {

constexpr int kMr = 6;            // rows of x per microkernel (broadcast operand)
constexpr int kNr = kPanelRows;   // weight rows per micro-panel (two vectors; 4x24 measured equal)
constexpr int kNv = kNr / 8;      // vectors per micro-panel row
constexpr int64_t kKc = 256;      // K per block: a micro-panel is 16 KiB, half of L1
constexpr int64_t kNb = 4 * kNr;  // weight rows packed per block (4 micro-panels)

// Loads the kNr weights of column k of a micro-panel whose elements have dtype P (f32 when
// packed per call, the stored dtype when packed at load) as kNv f32 vectors.
template <DType P>
inline void LoadPanelColumn(const void* panel, int64_t k, __m256 (&b)[kNv]) {
  static_assert(kNv == 2);
  if constexpr (P == DType::kF32) {
    const float* p = static_cast<const float*>(panel) + k * kNr;
    b[0] = _mm256_loadu_ps(p);
    b[1] = _mm256_loadu_ps(p + 8);
  } else if constexpr (P == DType::kBF16) {
    // Rows 0-7 are the low halves of the 32-bit lanes, rows 8-15 the high halves.
    const __m256i v = _mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(panel) + k * kNr));
    b[0] = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    b[1] = _mm256_castsi256_ps(
        _mm256_and_si256(v, _mm256_set1_epi32(static_cast<int32_t>(0xFFFF0000u))));
  } else {
    const auto* p = reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(panel) + k * kNr);
    b[0] = _mm256_cvtph_ps(_mm_loadu_si128(p));
    b[1] = _mm256_cvtph_ps(_mm_loadu_si128(p + 1));
  }
}

// Panels per call for MR rows: enough that the FMA chains (2 * MR * NP) reach 8, while the
// accumulators fit the 16 registers.
constexpr int StreamPanels(int mr) { return mr == 1 ? 4 : mr == 2 ? 2 : 1; }

// Prefetches `segments` runs of `bytes` bytes whose starts lie `stride` bytes apart from
// `first`, the cache lines spread evenly over `calls` calls of UpTo(1..calls). Default: none.
class Prefetcher {
 public:
  Prefetcher() = default;
  Prefetcher(const char* first, int64_t stride, int64_t segments, int64_t bytes, int64_t calls)
      : first_(first),
        stride_(stride),
        segment_lines_((bytes + 63) / 64),
        lines_(segments * segment_lines_),
        calls_(calls) {}

  void UpTo(int64_t call) {
    // One division per call; the walk itself only adds (a few M rows make ~20 lines a call).
    for (const int64_t end = lines_ * call / calls_; line_ < end; ++line_) {
      _mm_prefetch(segment_ + in_segment_ * 64, _MM_HINT_T0);
      if (++in_segment_ == segment_lines_) {
        in_segment_ = 0;
        segment_ += stride_;
      }
    }
  }

 private:
  const char* first_ = nullptr;
  int64_t stride_ = 0, segment_lines_ = 1, lines_ = 0, line_ = 0, calls_ = 1;
  const char* segment_ = first_;
  int64_t in_segment_ = 0;
};

// The rows of x in ceil(m / kMr) groups whose sizes differ by at most one: 32 rows run as
// 5,5,5,5,6,6 rather than 6,6,6,6,6,2, whose last group would keep only 4 FMA chains in flight.
struct RowGroups {
  explicit RowGroups(int64_t m) : m(m), count((m + kMr - 1) / kMr) {}
  int64_t Start(int64_t g) const { return g * m / count; }
  int Size(int64_t g) const { return static_cast<int>(Start(g + 1) - Start(g)); }
  int64_t PaddedRows() const { return count * kMr; }

  int64_t m, count;
};

// A K block's scales and zeros, for the microkernels. A segment is the columns of one group
// within the block (a row with one group has one segment per block).
struct QuantBlockArgs {
  const char* scales = nullptr;  // the first panel's f32 [16] of the block's first group
  const char* zeros = nullptr;   // its u8 [16] (formats with zeros)
  int64_t panel_bytes = 0;       // distance between panels
  int64_t segment = 0;           // columns per segment
  int64_t group_step = 0;        // groups per segment: 1, or 0 for one group per row
  int64_t ahead = 2048;          // streaming kernels prefetch the codes this far ahead

  QuantBlockArgs Panel(int p) const {
    QuantBlockArgs q = *this;
    q.scales += p * panel_bytes;
    q.zeros += p * panel_bytes;
    return q;
  }
};

// x as the microkernels read it, packed once per call for every output.
struct PackedX {
  // PackX: each row group's rows k-major, kMr slots per column (see PackX).
  const float* f = nullptr;
  // PackXInt8 (gemm_integer.cc): x rounded to int8 for the integer kernels.
  const int8_t* q = nullptr;
  const int32_t* sums = nullptr;
  const float* scales = nullptr;
  // With `quads` (IntWantsQuads): q's codes as the AVX-VNNI kernels for 8-bit codes multiply
  // them, a unit's even columns to a vector's low half and its odd ones to the high half.
  const int32_t* quads = nullptr;
  int64_t units = 0;  // 8-column units per row
  int64_t subs = 0;   // sub-blocks per row
  int64_t sub = 0;    // columns per sub-block
};

// Computes y[rows of groups g0..g1, n0:n1] for one work item (see Block in gemm_tiled.cc).
using BlockFn = void (*)(const PackedX&, const RowGroups&, int64_t, int64_t, const WeightMatrix&,
                         int64_t, int64_t, const float*, float*, int64_t);

// The thread's buffer of kNb x kKc floats for converted panels.
float* PackBuffer();
// The thread's accumulator tile for `row_groups` groups of kMr rows x kNb outputs.
float* AccumulatorTile(int64_t row_groups);
// y[rows of groups g0..g1, n0:n1] = the accumulator tile + bias.
void WriteTile(const float* acc, const RowGroups& groups, int64_t g0, int64_t g1, int64_t n0,
               int64_t n1, const float* bias, float* y, int64_t y_stride);

// The QuantBlockArgs of the K block at k0 of the weight block whose panels start at
// `block_panels`.
QuantBlockArgs BlockArgs(const WeightMatrix& w, const char* block_panels, int64_t k0);

// Whether the CPU has AVX-512 F, BW, VL and DQ: what the 16-lane float and quantized kernels
// need.
bool Avx512Available();

// Block() for kQuantPanels weights and float x (gemm_quant.cc).
BlockFn QuantBlockFor(const WeightMatrix& w);

// Rounds x[0:n] to int8 codes q = round(x / s) (ties to even), s = max|x| / 127, and returns s
// (0 when every x is 0, whose codes are then 0). Eight at a time: the division is IEEE's and
// vcvtps2dq rounds to nearest even as std::nearbyint does, so each code is the scalar one.
inline float RoundToInt8(const float* x, int64_t n, int8_t* q) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  __m256 vmax = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    vmax = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + j), abs_mask), vmax);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, vmax);
  float absmax = 0.0f;
  for (float v : lanes) absmax = std::max(absmax, v);
  for (; j < n; ++j) absmax = std::max(absmax, std::fabs(x[j]));
  const float scale = absmax / 127.0f;
  if (scale == 0.0f) {
    std::fill_n(q, n, int8_t{0});
    return scale;
  }
  const __m256 vscale = _mm256_set1_ps(scale);
  // 32 codes a store: the callers read them back 16 or 32 at a time, and a load that spans
  // several narrower stores waits for them to reach the cache (no store forwarding).
  const __m256i lane_order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (j = 0; j + 32 <= n; j += 32) {
    __m256i c[4];
    for (int i = 0; i < 4; ++i) {
      c[i] = _mm256_cvtps_epi32(_mm256_div_ps(_mm256_loadu_ps(x + j + 8 * i), vscale));
    }
    // packs work within 128-bit lanes: the bytes come out as 4-code runs of c0 c1 c2 c3 (low
    // lanes) then c0 c1 c2 c3 (high lanes), which the permutation puts back in order.
    const __m256i bytes =
        _mm256_packs_epi16(_mm256_packs_epi32(c[0], c[1]), _mm256_packs_epi32(c[2], c[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + j),
                        _mm256_permutevar8x32_epi32(bytes, lane_order));
  }
  for (; j + 8 <= n; j += 8) {
    const __m256i codes = _mm256_cvtps_epi32(_mm256_div_ps(_mm256_loadu_ps(x + j), vscale));
    const __m128i words =
        _mm_packs_epi32(_mm256_castsi256_si128(codes), _mm256_extracti128_si256(codes, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(q + j), _mm_packs_epi16(words, words));
  }
  for (; j < n; ++j) q[j] = static_cast<int8_t>(std::nearbyint(x[j] / scale));
  return scale;
}

// The integer kernels (gemm_integer.cc), for formats with int8 activations. Each sub-block of a
// row's columns sums exactly in int32 and is scaled by x's scale for it; the result is the
// same at every M. IntSubBlock is the columns per sub-block for w, or 0 where the integer
// kernels do not run it (they are switched off, or w's groups are not multiples of 8 columns),
// and the float kernels run x rounded instead.
int64_t IntSubBlock(const WeightMatrix& w);
BlockFn IntBlockFor(const WeightMatrix& w);
// The ISA and instruction of the integer kernels IntBlockFor(w) takes ("AVX-VNNI vpdpbusd").
std::string IntKernelIsa(const WeightMatrix& w);
// The ISA of the float kernels for quantized panels ("AVX-512" or "AVX2").
std::string QuantKernelIsa();
// Packs x, gathered through `order` (null: in order), rounded to int8 over each `block`
// columns (0: the whole row), into the calling thread's buffers for the integer kernels.
// Whether the integer kernels for w read x's codes as quads too (PackedX::quads).
bool IntWantsQuads(const WeightMatrix& w);

PackedX PackXInt8(const float* x, int64_t x_stride, int64_t k, const RowGroups& groups,
                  const int32_t* order, int64_t block, int64_t sub, bool quads, ThreadPool& pool);

}  // namespace tandem::kernels::internal::tiled
