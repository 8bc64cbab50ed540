// Blocked GEMM: y = x * W^T + bias as a BLIS-style outer-product kernel.
//
// The microkernel reads micro-panels of kNr weight rows stored k-major ([kc][kNr]): two vectors
// of weights per k and one broadcast x element per row of x, 12 independent FMA chains on
// 6 x 16 outputs with 2 + 6 loads per 12 FMAs. A row-major W ([N, K], any dtype) is packed
// block by block into f32 micro-panels on every call; a W packed at load (WeightLayout::kPanels)
// already is a sequence of micro-panels and is read in place, bf16/f16 converted in registers.
// Loops: N blocks (threads split these) > K blocks > groups of <= 6 rows of x > micro-panels;
// the block's weights and a contiguous accumulator for its outputs stay in cache while all of
// M streams past, and the next K block's weights are prefetched meanwhile. Measured on 1B shapes
// with weights cold (kernels_bench BM_GemmPrefill, 2 threads): 105 GFLOP/s before the
// accumulator and the prefetch, 130-160 after.

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <utility>
#include <vector>

#include "common/kernels/cpu/gemm_internal.h"
#include "common/kernels/cpu/quant_pack.h"
#include "common/kernels/cpu/simd_util.h"

namespace tandem::kernels::internal {
namespace {

constexpr int kMr = 6;            // rows of x per microkernel (broadcast operand)
constexpr int kNr = kPanelRows;   // weight rows per micro-panel (two vectors; 4x24 measured equal)
constexpr int kNv = kNr / 8;      // vectors per micro-panel row
constexpr int64_t kKc = 256;      // K per block: a micro-panel is 16 KiB, half of L1
constexpr int64_t kNb = 4 * kNr;  // weight rows packed per block (4 micro-panels)

// Transposes 8 vectors in place: afterwards v[c] holds element c of each input vector.
inline void Transpose8x8(__m256 (&v)[8]) {
  __m256 t[8], s[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(v[2 * i], v[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(v[2 * i], v[2 * i + 1]);
  }
  for (int h = 0; h < 2; ++h) {
    const int b = 4 * h;
    s[b + 0] = _mm256_shuffle_ps(t[b + 0], t[b + 2], 0x44);
    s[b + 1] = _mm256_shuffle_ps(t[b + 0], t[b + 2], 0xEE);
    s[b + 2] = _mm256_shuffle_ps(t[b + 1], t[b + 3], 0x44);
    s[b + 3] = _mm256_shuffle_ps(t[b + 1], t[b + 3], 0xEE);
  }
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm256_permute2f128_ps(s[i], s[i + 4], 0x20);
    v[i + 4] = _mm256_permute2f128_ps(s[i], s[i + 4], 0x31);
  }
}

// Packs rows [n0, n0 + nr) x columns [k0, k0 + kc) of W into panel[kk * kNr + r] as f32;
// rows past nr are zero so the microkernel never branches on them.
template <DType T>
void PackMicroPanel(const WeightMatrix& w, int64_t n0, int nr, int64_t k0, int64_t kc,
                    float* panel) {
  const char* base = static_cast<const char*>(w.data);
  const int64_t row_bytes = w.cols * static_cast<int64_t>(DTypeSize(T));
  const char* rows[kNr];
  for (int r = 0; r < kNr; ++r) rows[r] = r < nr ? base + (n0 + r) * row_bytes : nullptr;
  const int64_t kc8 = kc & ~int64_t{7};
  for (int64_t kk = 0; kk < kc8; kk += 8) {
    for (int half = 0; half < kNv; ++half) {
      __m256 v[8];
      TANDEM_UNROLL
      for (int r = 0; r < 8; ++r) {
        const char* row = rows[8 * half + r];
        v[r] = row ? simd::Load8<T>(row, k0 + kk) : _mm256_setzero_ps();
      }
      Transpose8x8(v);
      TANDEM_UNROLL
      for (int c = 0; c < 8; ++c) _mm256_storeu_ps(panel + (kk + c) * kNr + 8 * half, v[c]);
    }
  }
  for (int64_t kk = kc8; kk < kc; ++kk) {
    for (int r = 0; r < kNr; ++r) {
      panel[kk * kNr + r] = rows[r] ? simd::Load1<T>(rows[r], k0 + kk) : 0.0f;
    }
  }
}

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

// acc[0:MR, 0:NP*kNr] (+)= xp^T * panels over kc steps, where xp holds kMr x values per k
// (packed x) and the NP micro-panels, `panel_stride` bytes apart, have elements of dtype P;
// `first` stores, else adds. With kStream the panels are being read from memory for the first
// time (few rows of x): the kernel prefetches each kStreamAhead bytes ahead, one line per line
// consumed, which keeps DRAM busy without bursts. NP > 1 gives a row or two of x enough
// independent FMA chains to outrun memory; each output's sum is the same at every NP and MR.
template <DType P, bool kStream, int MR, int NP>
void MicroKernel(const float* xp, const void* panel, int64_t panel_stride, int64_t kc, bool first,
                 float* acc_out, int64_t acc_stride) {
  constexpr int64_t kStreamAhead = 2048;
  constexpr int64_t kColumnBytes = kNr * DTypeSize(P);
  const char* panels[NP];
  TANDEM_UNROLL
  for (int j = 0; j < NP; ++j) panels[j] = static_cast<const char*>(panel) + j * panel_stride;
  __m256 acc[MR][NP][kNv];
  TANDEM_UNROLL
  for (int i = 0; i < MR; ++i) TANDEM_UNROLL
  for (int j = 0; j < NP; ++j) TANDEM_UNROLL
  for (int v = 0; v < kNv; ++v) acc[i][j][v] = _mm256_setzero_ps();
#pragma GCC unroll 4
  for (int64_t k = 0; k < kc; ++k) {
    if constexpr (kStream) {
      if ((k * kColumnBytes) % 64 == 0) {
        TANDEM_UNROLL
        for (int j = 0; j < NP; ++j) {
          _mm_prefetch(panels[j] + k * kColumnBytes + kStreamAhead, _MM_HINT_T0);
        }
      }
    }
    __m256 b[NP][kNv];
    TANDEM_UNROLL
    for (int j = 0; j < NP; ++j) LoadPanelColumn<P>(panels[j], k, b[j]);
    TANDEM_UNROLL
    for (int i = 0; i < MR; ++i) {
      const __m256 a = _mm256_broadcast_ss(xp + k * kMr + i);
      TANDEM_UNROLL
      for (int j = 0; j < NP; ++j) TANDEM_UNROLL
      for (int v = 0; v < kNv; ++v) acc[i][j][v] = _mm256_fmadd_ps(a, b[j][v], acc[i][j][v]);
    }
  }
  TANDEM_UNROLL
  for (int i = 0; i < MR; ++i) TANDEM_UNROLL
  for (int j = 0; j < NP; ++j) {
    float* out = acc_out + i * acc_stride + j * kNr;
    TANDEM_UNROLL
    for (int v = 0; v < kNv; ++v) {
      const __m256 sum =
          first ? acc[i][j][v] : _mm256_add_ps(acc[i][j][v], _mm256_loadu_ps(out + 8 * v));
      _mm256_storeu_ps(out + 8 * v, sum);
    }
  }
}

using KernelFn = void (*)(const float*, const void*, int64_t, int64_t, bool, float*, int64_t);

// A microkernel for MR rows of x and how many micro-panels it takes at once.
struct Kernel {
  KernelFn fn;
  int panels;
};

// Panels per call for MR rows: enough that the FMA chains (2 * MR * NP) reach 8, while the
// accumulators fit the 16 registers.
constexpr int StreamPanels(int mr) { return mr == 1 ? 4 : mr == 2 ? 2 : 1; }

template <DType P, bool kStream, bool kWide, int... I>
constexpr std::array<Kernel, sizeof...(I)> MakeKernels(std::integer_sequence<int, I...>) {
  return {Kernel{&MicroKernel < P, kStream, I + 1, kWide ? StreamPanels(I + 1) : 1 >,
                 kWide ? StreamPanels(I + 1) : 1}...};
}
// Indexed by MR - 1. Wide kernels take StreamPanels(MR) micro-panels per call.
template <DType P, bool kStream = false, bool kWide = false>
constexpr auto kKernels = MakeKernels<P, kStream, kWide>(std::make_integer_sequence<int, kMr>());

// Converts kc columns of a micro-panel packed at load (dtype T) to f32 in row order.
template <DType T>
void ConvertPanel(const void* panel, int64_t kc, float* out) {
  for (int64_t k = 0; k < kc; ++k) {
    __m256 b[kNv];
    LoadPanelColumn<T>(panel, k, b);
    TANDEM_UNROLL
    for (int v = 0; v < kNv; ++v) _mm256_storeu_ps(out + k * kNr + 8 * v, b[v]);
  }
}

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

// Thread-local so each worker packs into its own L2-resident buffer without allocating.
float* PackBuffer() {
  thread_local std::vector<float> buffer(kNb * kKc);
  return buffer.data();
}

// The rows of x in ceil(m / kMr) groups whose sizes differ by at most one: 32 rows run as
// 5,5,5,5,6,6 rather than 6,6,6,6,6,2, whose last group would keep only 4 FMA chains in flight.
struct RowGroups {
  explicit RowGroups(int64_t m) : m(m), count((m + kMr - 1) / kMr) {}
  int64_t Start(int64_t g) const { return g * m / count; }
  int Size(int64_t g) const { return static_cast<int>(Start(g + 1) - Start(g)); }
  int64_t PaddedRows() const { return count * kMr; }

  int64_t m, count;
};

// How the GEMM reads x for a quantized matrix: its columns in the panels' order, and each row
// rounded to int8 for a W8A8 format (see WeightMatrix::input_order, QuantFormat).
struct XTransform {
  const int32_t* order = nullptr;
  bool int8 = false;

  static XTransform Of(const WeightMatrix& w) {
    if (w.layout != WeightLayout::kQuantPanels) return {};
    return {w.input_order, w.quant.int8_activations};
  }
  bool operator==(const XTransform&) const = default;
};

// Row `src` of x as the GEMM multiplies it: gathered through t.order, rounded by t.int8.
void TransformRow(const float* src, int64_t k, const XTransform& t, float* out) {
  for (int64_t j = 0; j < k; ++j) out[j] = src[t.order ? t.order[j] : j];
  if (!t.int8) return;
  float absmax = 0.0f;
  for (int64_t j = 0; j < k; ++j) absmax = std::max(absmax, std::fabs(out[j]));
  const float scale = absmax / 127.0f;
  if (scale == 0.0f) return;  // all zeros stay zeros
  for (int64_t j = 0; j < k; ++j) out[j] = std::nearbyint(out[j] / scale) * scale;
}

// Packs x group by group, each group's rows k-major (kMr slots per k, unused slots zero) within
// each K block of kKc columns, the groups of one K block contiguous: row Start(g) + i, column
// k0 + kk lands at xp[k0 * m_pad + (g * kc + kk) * kMr + i] (m_pad: PaddedRows(); kc: the
// block's width). Unpacked, the rows of a microkernel sit a multiple of 4 KiB apart for typical
// K and fight over the same L1 sets; blocked by K, the microkernels of one K block read x as a
// single sequential stream. A transform `t` is applied to each row first.
void PackX(const float* x, int64_t x_stride, int64_t k, const RowGroups& groups,
           const XTransform& t, float* xp, ThreadPool& pool) {
  const int64_t m_pad = groups.PaddedRows();
  const bool transform = t.order != nullptr || t.int8;
  auto pack = [&](int64_t g0, int64_t g1) {
    thread_local std::vector<float> row;
    if (transform && static_cast<int64_t>(row.size()) < k) row.resize(k);
    for (int64_t g = g0; g < g1; ++g) {
      for (int i = 0; i < kMr; ++i) {
        const float* src = i < groups.Size(g) ? x + (groups.Start(g) + i) * x_stride : nullptr;
        if (src != nullptr && transform) {
          TransformRow(src, k, t, row.data());
          src = row.data();
        }
        for (int64_t k0 = 0; k0 < k; k0 += kKc) {
          const int64_t kc = std::min(kKc, k - k0);
          float* dst = xp + k0 * m_pad + g * kc * kMr + i;
          for (int64_t kk = 0; kk < kc; ++kk) dst[kk * kMr] = src ? src[k0 + kk] : 0.0f;
        }
      }
    }
  };
  // A decode step's few rows are not worth waking the pool for.
  constexpr int64_t kGrain = 8;
  if (groups.count <= kGrain) return pack(0, groups.count);
  pool.ParallelFor(groups.count, kGrain, pack);
}

// The thread's accumulator tile for `row_groups` groups of kMr rows x kNb outputs (see Block).
float* AccumulatorTile(int64_t row_groups) {
  thread_local std::vector<float> buffer;
  const int64_t floats = row_groups * kMr * kNb;
  if (static_cast<int64_t>(buffer.size()) < floats) buffer.resize(floats);
  return buffer.data();
}

// y[rows of groups g0..g1, n0:n1] = the accumulator tile + bias.
void WriteTile(const float* acc, const RowGroups& groups, int64_t g0, int64_t g1, int64_t n0,
               int64_t n1, const float* bias, float* y, int64_t y_stride) {
  for (int64_t g = g0; g < g1; ++g) {
    for (int i = 0; i < groups.Size(g); ++i) {
      const float* src = acc + ((g - g0) * kMr + i) * kNb;
      float* dst = y + (groups.Start(g) + i) * y_stride + n0;
      for (int64_t j = 0; j < n1 - n0; ++j) dst[j] = src[j] + (bias ? bias[n0 + j] : 0.0f);
    }
  }
}

// Computes y[rows of groups g0..g1, n0:n1] for one work item; n1 - n0 <= kNb and n0 is a
// multiple of kNb. xp is x packed by PackX. The sums build up over the K blocks in a contiguous
// thread-local tile and are written to y once at the end: y's own rows lie N floats apart, a
// power of two for most models, so the rows of a tile would share cache sets and be refetched
// from L3 on every K block (measured: 20% of the GEMM's time).
template <DType T, WeightLayout L>
void Block(const float* xp, const RowGroups& groups, int64_t g0, int64_t g1, const WeightMatrix& w,
           int64_t n0, int64_t n1, const float* bias, float* y, int64_t y_stride) {
  constexpr bool kPrepacked = L == WeightLayout::kPanels;
  constexpr int64_t kElem = DTypeSize(T);
  // Panels packed at load are read in place, converted in registers. Few rows of x (decode)
  // stream them straight from memory; many rows (prefill) reuse each block so often that
  // converting it to f32 once beats converting it in every microkernel.
  constexpr int64_t kStreamMaxGroups = 2, kConvertMinGroups = 8;
  const bool stream = kPrepacked && g1 - g0 <= kStreamMaxGroups;
  const bool to_f32 = !kPrepacked || (T != DType::kF32 && g1 - g0 >= kConvertMinGroups);
  const Kernel* narrow = to_f32   ? kKernels<DType::kF32>.data()
                         : stream ? kKernels<T, true>.data()
                                  : kKernels<T>.data();
  const Kernel* kernels = stream ? kKernels<T, true, true>.data() : narrow;
  float* acc = AccumulatorTile(g1 - g0);
  const int64_t m_pad = groups.PaddedRows();
  const int panels = static_cast<int>((n1 - n0 + kNr - 1) / kNr);
  const char* base = static_cast<const char*>(w.data);
  // Packed at load, a panel is kNr rows x all columns.
  const int64_t panel_bytes = w.cols * kNr * kElem;
  const char* block_panels = base + (n0 / kNr) * panel_bytes;
  float* packed = to_f32 ? PackBuffer() : nullptr;
  for (int64_t k0 = 0; k0 < w.cols; k0 += kKc) {
    const int64_t kc = std::min(kKc, w.cols - k0);
    const void* panel[kNb / kNr];
    for (int p = 0; p < panels; ++p) {
      float* f32 = packed + p * kKc * kNr;
      if constexpr (kPrepacked) {
        panel[p] = block_panels + p * panel_bytes + k0 * kNr * kElem;
        if (to_f32) {
          ConvertPanel<T>(panel[p], kc, f32);
          panel[p] = f32;
        }
      } else {
        const int nr = static_cast<int>(std::min<int64_t>(kNr, n1 - n0 - p * kNr));
        PackMicroPanel<T>(w, n0 + p * kNr, nr, k0, kc, f32);
        panel[p] = f32;
      }
    }
    const bool first = k0 == 0;
    // Otherwise the next K block's weights are prefetched while this one computes, spread
    // evenly over the microkernel calls: packing or the kernel would wait on DRAM latency, and
    // a model's weights are never in cache.
    const int64_t next = k0 + kc, calls = (g1 - g0) * panels;
    Prefetcher prefetch;
    if (next < w.cols && !stream) {
      const int64_t next_kc = std::min(kKc, w.cols - next);
      prefetch = kPrepacked ? Prefetcher(block_panels + next * kNr * kElem, panel_bytes, panels,
                                         next_kc * kNr * kElem, calls)
                            : Prefetcher(base + (n0 * w.cols + next) * kElem, w.cols * kElem,
                                         n1 - n0, next_kc * kElem, calls);
    }
    int64_t call = 0;
    for (int64_t g = g0; g < g1; ++g) {
      const int mr = groups.Size(g);
      const float* xg = xp + k0 * m_pad + g * kc * kMr;
      float* acc_g = acc + (g - g0) * kMr * kNb;
      for (int p = 0; p < panels;) {
        prefetch.UpTo(++call);
        // A block at the end of a matrix may hold fewer panels than a wide kernel takes.
        const Kernel kernel =
            p + kernels[mr - 1].panels <= panels ? kernels[mr - 1] : narrow[mr - 1];
        kernel.fn(xg, panel[p], panel_bytes, kc, first, acc_g + p * kNr, kNb);
        p += kernel.panels;
      }
    }
  }
  WriteTile(acc, groups, g0, g1, n0, n1, bias, y, y_stride);
}

// ---------------------------------------------------------------------------------------------
// Quantized panels (WeightLayout::kQuantPanels, quant_pack.h). The codes of a column become the
// exact integers code - zero in registers; a group's products with x sum in registers and are
// scaled once into the accumulator tile. Prefill converts each block to those integers (f32)
// once, as for bf16; both paths sum in the same order, so results do not depend on M.
// ---------------------------------------------------------------------------------------------

// A K block's scales and zeros, for the microkernels. A segment is the columns of one group
// within the block (a row with one group has one segment per block).
struct QuantBlockArgs {
  const char* scales = nullptr;  // the first panel's f32 [16] of the block's first group
  const char* zeros = nullptr;   // its u8 [16] (formats with zeros)
  int64_t panel_bytes = 0;       // distance between panels
  int64_t segment = 0;           // columns per segment
  int64_t group_step = 0;        // groups per segment: 1, or 0 for one group per row

  QuantBlockArgs Panel(int p) const {
    QuantBlockArgs q = *this;
    q.scales += p * panel_bytes;
    q.zeros += p * panel_bytes;
    return q;
  }
};

constexpr int32_t kFloatMagic = 0x4B000000;  // 2^23: OR-ing an integer below 2^23 into its
                                             // mantissa makes the float 2^23 + integer

// Columns one load of codes gives: 4-bit codes lie in units of 8 columns (quant_pack.h).
template <int kBits>
constexpr int kStep = kBits == 4 ? 8 : 1;

// 2^23 + zero for each row of a panel's group, as kNv vectors.
template <int kBits, bool kZero>
inline void LoadZeros(const char* zeros, __m256 (&zf)[kNv]) {
  if constexpr (kZero) {
    const auto* z = reinterpret_cast<const uint8_t*>(zeros);
    TANDEM_UNROLL
    for (int v = 0; v < kNv; ++v) {
      const __m256i zi =
          _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(z + 8 * v)));
      zf[v] = _mm256_castsi256_ps(_mm256_or_si256(zi, _mm256_set1_epi32(kFloatMagic)));
    }
  } else {
    TANDEM_UNROLL
    for (int v = 0; v < kNv; ++v) zf[v] = _mm256_set1_ps(8388608.0f + (1 << (kBits - 1)));
  }
}

// 8 codes (as 32-bit integers below 2^23) minus their zeros (2^23 + zero), exact in f32.
inline __m256 CodesMinusZeros(__m256i codes, __m256 zf) {
  return _mm256_sub_ps(_mm256_castsi256_ps(_mm256_or_si256(codes, _mm256_set1_epi32(kFloatMagic))),
                       zf);
}

inline __m256i Load8Bytes(const uint8_t* p, bool sign) {
  const __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return sign ? _mm256_cvtepi8_epi32(v) : _mm256_cvtepu8_epi32(v);
}

// The codes of kStep columns from k of a panel as loaded: 8 bits, one column as 32-bit
// integers; 4 bits, a unit of 8 columns, each 32-bit lane one row's 8 nibbles.
template <int kBits, bool kZero>
inline void LoadUnit(const uint8_t* codes, int64_t k, __m256i (&raw)[kNv]) {
  static_assert(kNv == 2);
  TANDEM_UNROLL
  for (int v = 0; v < kNv; ++v) {
    if constexpr (kBits == 8) {
      raw[v] = Load8Bytes(codes + k * kNr + 8 * v, !kZero);
    } else {
      raw[v] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + k * 8 + 32 * v));
    }
  }
}

// Column k + c of a unit as code - zero, exact in f32. Symmetric 8-bit codes are stored as the
// signed code - 128 and convert directly.
template <int kBits, bool kZero>
inline void UnitColumn(const __m256i (&raw)[kNv], int c, const __m256 (&zf)[kNv],
                       __m256 (&b)[kNv]) {
  TANDEM_UNROLL
  for (int v = 0; v < kNv; ++v) {
    if constexpr (kBits == 8) {
      b[v] = kZero ? CodesMinusZeros(raw[v], zf[v]) : _mm256_cvtepi32_ps(raw[v]);
    } else {
      const __m256i nibble =
          _mm256_and_si256(_mm256_srli_epi32(raw[v], 4 * c), _mm256_set1_epi32(0xF));
      b[v] = CodesMinusZeros(nibble, zf[v]);
    }
  }
}

// Converts kc columns of a panel's codes to code - zero in f32, in row order ([kc][16]).
template <int kBits, bool kZero>
void ConvertQuantPanel(const void* codes, int64_t kc, const QuantBlockArgs& q, float* out) {
  constexpr int kS = kStep<kBits>;
  for (int64_t s0 = 0, seg = 0; s0 < kc; s0 += q.segment, ++seg) {
    __m256 zf[kNv];
    LoadZeros<kBits, kZero>(q.zeros + seg * q.group_step * kNr, zf);
    const int64_t s1 = std::min(kc, s0 + q.segment);
    for (int64_t k = s0; k < s1; k += kS) {
      __m256i raw[kNv];
      LoadUnit<kBits, kZero>(static_cast<const uint8_t*>(codes), k, raw);
      for (int c = 0; c < kS && k + c < s1; ++c) {
        __m256 b[kNv];
        UnitColumn<kBits, kZero>(raw, c, zf, b);
        TANDEM_UNROLL
        for (int v = 0; v < kNv; ++v) _mm256_storeu_ps(out + (k + c) * kNr + 8 * v, b[v]);
      }
    }
  }
}

// MicroKernel for quantized panels: acc[0:MR, 0:NP*kNr] (+)= xp^T * (codes - zeros) * scales.
// kBits 0: the panels were converted to f32 (ConvertQuantPanel). One segment at a time, the
// sums build up in registers from zero and are added to acc scaled by their group's scales.
template <int kBits, bool kZero, bool kStream, int MR, int NP>
void QuantMicroKernel(const float* xp, const void* panel, int64_t panel_stride, int64_t kc,
                      const QuantBlockArgs& q, bool first, float* acc_out, int64_t acc_stride) {
  constexpr int64_t kStreamAhead = 2048;
  constexpr int64_t kColumnBytes = kBits == 0 ? kNr * 4 : kNr * kBits / 8;
  constexpr int kS = kBits == 0 ? 1 : kStep<kBits>;
  const char* panels[NP];
  TANDEM_UNROLL
  for (int j = 0; j < NP; ++j) panels[j] = static_cast<const char*>(panel) + j * panel_stride;
  for (int64_t s0 = 0, seg = 0; s0 < kc; s0 += q.segment, ++seg) {
    const int64_t group = seg * q.group_step;
    __m256 zf[NP][kNv];
    if constexpr (kBits != 0) {
      TANDEM_UNROLL
      for (int j = 0; j < NP; ++j) {
        LoadZeros<kBits, kZero>(q.zeros + j * q.panel_bytes + group * kNr, zf[j]);
      }
    }
    if constexpr (kStream) {  // the next group's scales (and zeros), which follow these
      TANDEM_UNROLL
      for (int j = 0; j < NP; ++j) {
        _mm_prefetch(q.scales + j * q.panel_bytes + (group + q.group_step) * kNr * 4,
                     _MM_HINT_T0);
        if constexpr (kZero) {
          _mm_prefetch(q.zeros + j * q.panel_bytes + (group + q.group_step) * kNr, _MM_HINT_T0);
        }
      }
    }
    __m256 acc[MR][NP][kNv];
    TANDEM_UNROLL
    for (int i = 0; i < MR; ++i) TANDEM_UNROLL
    for (int j = 0; j < NP; ++j) TANDEM_UNROLL
    for (int v = 0; v < kNv; ++v) acc[i][j][v] = _mm256_setzero_ps();
    const int64_t s1 = std::min(kc, s0 + q.segment);
#pragma GCC unroll 4
    for (int64_t k = s0; k < s1; k += kS) {
      if constexpr (kStream) {
        if ((k * kColumnBytes) % 64 == 0) {
          TANDEM_UNROLL
          for (int j = 0; j < NP; ++j) {
            _mm_prefetch(panels[j] + k * kColumnBytes + kStreamAhead, _MM_HINT_T0);
          }
        }
      }
      TANDEM_UNROLL
      for (int j = 0; j < NP; ++j) {
        __m256i raw[kNv];
        if constexpr (kBits != 0) {
          LoadUnit<kBits, kZero>(reinterpret_cast<const uint8_t*>(panels[j]), k, raw);
        }
        TANDEM_UNROLL
        for (int c = 0; c < kS; ++c) {
          if (kS > 1 && k + c >= s1) break;
          __m256 b[kNv];
          if constexpr (kBits == 0) {
            LoadPanelColumn<DType::kF32>(panels[j], k, b);
          } else {
            UnitColumn<kBits, kZero>(raw, c, zf[j], b);
          }
          TANDEM_UNROLL
          for (int i = 0; i < MR; ++i) {
            const __m256 a = _mm256_broadcast_ss(xp + (k + c) * kMr + i);
            TANDEM_UNROLL
            for (int v = 0; v < kNv; ++v) acc[i][j][v] = _mm256_fmadd_ps(a, b[v], acc[i][j][v]);
          }
        }
      }
    }
    const bool store = first && s0 == 0;
    TANDEM_UNROLL
    for (int j = 0; j < NP; ++j) {
      const auto* scales =
          reinterpret_cast<const float*>(q.scales + j * q.panel_bytes) + group * kNr;
      TANDEM_UNROLL
      for (int v = 0; v < kNv; ++v) {
        const __m256 s = _mm256_loadu_ps(scales + 8 * v);
        TANDEM_UNROLL
        for (int i = 0; i < MR; ++i) {
          float* out = acc_out + i * acc_stride + j * kNr + 8 * v;
          _mm256_storeu_ps(out, store ? _mm256_mul_ps(acc[i][j][v], s)
                                      : _mm256_fmadd_ps(acc[i][j][v], s, _mm256_loadu_ps(out)));
        }
      }
    }
  }
}

using QuantKernelFn = void (*)(const float*, const void*, int64_t, int64_t, const QuantBlockArgs&,
                               bool, float*, int64_t);

struct QuantKernel {
  QuantKernelFn fn;
  int panels;
};

template <int kBits, bool kZero, bool kStream, bool kWide, int... I>
constexpr std::array<QuantKernel, sizeof...(I)> MakeQuantKernels(
    std::integer_sequence<int, I...>) {
  return {QuantKernel{
      &QuantMicroKernel < kBits, kZero, kStream, I + 1, kWide ? StreamPanels(I + 1) : 1 >,
      kWide ? StreamPanels(I + 1) : 1}...};
}
// Indexed by MR - 1, as kKernels.
template <int kBits, bool kZero, bool kStream = false, bool kWide = false>
constexpr auto kQuantKernels =
    MakeQuantKernels<kBits, kZero, kStream, kWide>(std::make_integer_sequence<int, kMr>());

// The same kernels on AVX-512 (a panel column is one zmm), chosen at run time where the CPU has
// it: decode over quantized weights is limited by converting codes, not by memory, and 16 lanes
// per instruction halve that work. Each lane runs the AVX2 kernel's operations in the same
// order, so the results are bit-identical.
#define TANDEM_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
// GCC 12 flags the intrinsics' own _mm512_undefined_* placeholders as maybe-uninitialized.
#if !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

// What UnitColumn512 subtracts from a panel column's codes: 2^23 + zero for 8 bits, the zero
// itself for 4 bits (whose codes become floats by table lookup); symmetric 4-bit codes need
// nothing subtracted, their table holding code - 8.
template <int kBits, bool kZero>
TANDEM_AVX512 inline __m512 LoadZeros512(const char* zeros) {
  if constexpr (kZero) {
    const __m512i z =
        _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(zeros)));
    if constexpr (kBits == 4) return _mm512_cvtepi32_ps(z);
    return _mm512_castsi512_ps(_mm512_or_si512(z, _mm512_set1_epi32(kFloatMagic)));
  } else {
    return _mm512_set1_ps(8388608.0f + (1 << (kBits - 1)));
  }
}

// The float of each 4-bit code (index = the low 4 bits of a lane): code - 8 without zeros,
// else the code, from which the zero is then subtracted; the same exact values the AVX2
// kernel's 2^23 trick gives, in one permute instead of three operations.
template <bool kZero>
TANDEM_AVX512 inline __m512 NibbleTable512() {
  const __m512 codes = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  return kZero ? codes : _mm512_sub_ps(codes, _mm512_set1_ps(8.0f));
}

TANDEM_AVX512 inline __m512 CodesMinusZeros512(__m512i codes, __m512 zf) {
  return _mm512_sub_ps(_mm512_castsi512_ps(_mm512_or_si512(codes, _mm512_set1_epi32(kFloatMagic))),
                       zf);
}

// LoadUnit and UnitColumn with a panel column in one vector.
template <int kBits, bool kZero>
TANDEM_AVX512 inline __m512i LoadUnit512(const uint8_t* codes, int64_t k) {
  if constexpr (kBits == 8) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + k * kNr));
    return kZero ? _mm512_cvtepu8_epi32(v) : _mm512_cvtepi8_epi32(v);
  } else {
    return _mm512_loadu_si512(codes + k * 8);
  }
}

template <int kBits, bool kZero>
TANDEM_AVX512 inline __m512 UnitColumn512(__m512i raw, int c, __m512 zf) {
  if constexpr (kBits == 8) {
    return kZero ? CodesMinusZeros512(raw, zf) : _mm512_cvtepi32_ps(raw);
  } else {
    // vpermps reads the low 4 bits of each lane: column c's nibble once shifted down.
    const __m512 b = _mm512_permutexvar_ps(c == 0 ? raw : _mm512_srli_epi32(raw, 4 * c),
                                           NibbleTable512<kZero>());
    return kZero ? _mm512_sub_ps(b, zf) : b;
  }
}

// Columns begin[n] + t, t in [t0, t1), of the first `segs` segments into acc[n] (see
// QuantMicroKernel512).
template <int kBits, bool kZero, bool kStream, int MR, int NP, int kSegs>
TANDEM_AVX512 __attribute__((always_inline)) inline void SegmentColumns512(
    const float* xp, const char* const (&panels)[NP], const int64_t (&begin)[kSegs],
    const int64_t (&length)[kSegs], const __m512 (&zf)[kSegs][NP], int64_t t0, int64_t t1, int segs,
    __m512 (&acc)[kSegs][MR][NP]) {
  constexpr int64_t kStreamAhead = 2048;
  constexpr int64_t kColumnBytes = kNr * kBits / 8;
  constexpr int kS = kStep<kBits>;
#pragma GCC unroll 4
  for (int64_t t = t0; t < t1; t += kS) {
    TANDEM_UNROLL
    for (int n = 0; n < kSegs; ++n) {
      if (n >= segs) break;
      const int64_t k = begin[n] + t;
      if constexpr (kStream) {
        if ((k * kColumnBytes) % 64 == 0) {
          TANDEM_UNROLL
          for (int j = 0; j < NP; ++j) {
            _mm_prefetch(panels[j] + k * kColumnBytes + kStreamAhead, _MM_HINT_T0);
          }
        }
      }
      TANDEM_UNROLL
      for (int j = 0; j < NP; ++j) {
        const __m512i raw =
            LoadUnit512<kBits, kZero>(reinterpret_cast<const uint8_t*>(panels[j]), k);
        TANDEM_UNROLL
        for (int c = 0; c < kS; ++c) {
          if (kS > 1 && t + c >= length[n]) break;
          const __m512 b = UnitColumn512<kBits, kZero>(raw, c, zf[n][j]);
          TANDEM_UNROLL
          for (int i = 0; i < MR; ++i) {
            acc[n][i][j] = _mm512_fmadd_ps(_mm512_set1_ps(xp[(k + c) * kMr + i]), b, acc[n][i][j]);
          }
        }
      }
    }
  }
}

template <int kBits, bool kZero, bool kStream, int MR, int NP>
TANDEM_AVX512 void QuantMicroKernel512(const float* xp, const void* panel, int64_t panel_stride,
                                       int64_t kc, const QuantBlockArgs& q, bool first,
                                       float* acc_out, int64_t acc_stride) {
  // One row of x against NP panels is NP chains of FMAs, too few to hide their latency: that
  // kernel runs two segments at once (each still sums from zero, column by column, and the
  // two are scaled into acc in order, so the result is the same).
  constexpr int kSegs = kStream && MR == 1 ? 2 : 1;
  const char* panels[NP];
  TANDEM_UNROLL
  for (int j = 0; j < NP; ++j) panels[j] = static_cast<const char*>(panel) + j * panel_stride;
  for (int64_t s0 = 0, seg = 0; s0 < kc; s0 += kSegs * q.segment, seg += kSegs) {
    int64_t begin[kSegs], length[kSegs];
    TANDEM_UNROLL
    for (int n = 0; n < kSegs; ++n) {
      begin[n] = std::min(kc, s0 + n * q.segment);
      length[n] = std::min(kc, begin[n] + q.segment) - begin[n];  // 0: no such segment
    }
    __m512 zf[kSegs][NP], acc[kSegs][MR][NP];
    TANDEM_UNROLL
    for (int n = 0; n < kSegs; ++n) {
      const int64_t group = (seg + n) * q.group_step;
      TANDEM_UNROLL
      for (int j = 0; j < NP; ++j) {
        zf[n][j] = LoadZeros512<kBits, kZero>(q.zeros + j * q.panel_bytes + group * kNr);
        if constexpr (kStream) {  // the next segments' scales (and zeros), which follow these
          _mm_prefetch(q.scales + j * q.panel_bytes + (group + kSegs * q.group_step) * kNr * 4,
                       _MM_HINT_T0);
          if constexpr (kZero) {
            _mm_prefetch(q.zeros + j * q.panel_bytes + (group + kSegs * q.group_step) * kNr,
                         _MM_HINT_T0);
          }
        }
        TANDEM_UNROLL
        for (int i = 0; i < MR; ++i) acc[n][i][j] = _mm512_setzero_ps();
      }
    }
    // Columns t of every segment that has them: all segments while the last one lasts, then
    // the first alone (only the last segment of a block can be shorter).
    SegmentColumns512<kBits, kZero, kStream, MR, NP, kSegs>(xp, panels, begin, length, zf, 0,
                                                            length[kSegs - 1], kSegs, acc);
    if constexpr (kSegs > 1) {
      SegmentColumns512<kBits, kZero, kStream, MR, NP, kSegs>(xp, panels, begin, length, zf,
                                                              length[kSegs - 1], length[0], 1, acc);
    }
    TANDEM_UNROLL
    for (int n = 0; n < kSegs; ++n) {
      if (length[n] == 0) break;
      const int64_t group = (seg + n) * q.group_step;
      const bool store = first && s0 == 0 && n == 0;
      TANDEM_UNROLL
      for (int j = 0; j < NP; ++j) {
        const __m512 s = _mm512_loadu_ps(
            reinterpret_cast<const float*>(q.scales + j * q.panel_bytes) + group * kNr);
        TANDEM_UNROLL
        for (int i = 0; i < MR; ++i) {
          float* out = acc_out + i * acc_stride + j * kNr;
          _mm512_storeu_ps(out, store ? _mm512_mul_ps(acc[n][i][j], s)
                                      : _mm512_fmadd_ps(acc[n][i][j], s, _mm512_loadu_ps(out)));
        }
      }
    }
  }
}

#if !defined(__clang__)
#pragma GCC diagnostic pop
#endif

template <int kBits, bool kZero, bool kStream, bool kWide, int... I>
constexpr std::array<QuantKernel, sizeof...(I)> MakeQuantKernels512(
    std::integer_sequence<int, I...>) {
  return {QuantKernel{&QuantMicroKernel512 < kBits, kZero, kStream, I + 1,
                      kWide ? StreamPanels(I + 1) : 1 >, kWide ? StreamPanels(I + 1) : 1}...};
}
template <int kBits, bool kZero, bool kStream = false, bool kWide = false>
constexpr auto kQuantKernels512 =
    MakeQuantKernels512<kBits, kZero, kStream, kWide>(std::make_integer_sequence<int, kMr>());

bool Avx512Available() {
  __builtin_cpu_init();  // this may run before the runtime's own initialization
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

std::atomic<bool> use_avx512_quant{Avx512Available()};

// Block() for quantized panels.
template <int kBits, bool kZero>
void QuantBlock(const float* xp, const RowGroups& groups, int64_t g0, int64_t g1,
                const WeightMatrix& w, int64_t n0, int64_t n1, const float* bias, float* y,
                int64_t y_stride) {
  constexpr int64_t kStreamMaxGroups = 2, kConvertMinGroups = 8;
  const bool stream = g1 - g0 <= kStreamMaxGroups;
  const bool to_f32 = g1 - g0 >= kConvertMinGroups;
  const bool avx512 = use_avx512_quant.load(std::memory_order_relaxed);
  const QuantKernel* narrow = to_f32   ? kQuantKernels<0, false>.data()
                              : stream ? (avx512 ? kQuantKernels512<kBits, kZero, true>.data()
                                                 : kQuantKernels<kBits, kZero, true>.data())
                                       : (avx512 ? kQuantKernels512<kBits, kZero>.data()
                                                 : kQuantKernels<kBits, kZero>.data());
  const QuantKernel* kernels = !stream  ? narrow
                               : avx512 ? kQuantKernels512<kBits, kZero, true, true>.data()
                                        : kQuantKernels<kBits, kZero, true, true>.data();
  float* acc = AccumulatorTile(g1 - g0);
  const int64_t m_pad = groups.PaddedRows();
  const int panels = static_cast<int>((n1 - n0 + kNr - 1) / kNr);
  const QuantPanelLayout layout = QuantPanelLayout::Of(w.quant, w.cols);
  const int64_t group_size = w.quant.group_size > 0 ? w.quant.group_size : w.cols;
  const bool one_group = group_size == w.cols;
  const char* block_panels = static_cast<const char*>(w.data) + (n0 / kNr) * layout.panel_bytes;
  float* packed = to_f32 ? PackBuffer() : nullptr;
  for (int64_t k0 = 0; k0 < w.cols; k0 += kKc) {
    const int64_t kc = std::min(kKc, w.cols - k0);
    const int64_t first_group = one_group ? 0 : k0 / group_size;
    const QuantBlockArgs q{
        .scales = block_panels + layout.scale_offset + first_group * kNr * 4,
        .zeros = block_panels + layout.zero_offset + first_group * kNr,
        .panel_bytes = layout.panel_bytes,
        .segment = one_group ? kKc : group_size,
        .group_step = one_group ? 0 : 1,
    };
    const void* panel[kNb / kNr];
    for (int p = 0; p < panels; ++p) {
      panel[p] = block_panels + p * layout.panel_bytes + k0 * kNr * kBits / 8;
      if (to_f32) {
        float* f32 = packed + p * kKc * kNr;
        ConvertQuantPanel<kBits, kZero>(panel[p], kc, q.Panel(p), f32);
        panel[p] = f32;
      }
    }
    const bool first = k0 == 0;
    const int64_t next = k0 + kc, calls = (g1 - g0) * panels;
    Prefetcher prefetch;
    if (next < w.cols && !stream) {
      const int64_t next_kc = std::min(kKc, w.cols - next);
      prefetch = Prefetcher(block_panels + next * kNr * kBits / 8, layout.panel_bytes, panels,
                            next_kc * kNr * kBits / 8, calls);
    }
    int64_t call = 0;
    for (int64_t g = g0; g < g1; ++g) {
      const int mr = groups.Size(g);
      const float* xg = xp + k0 * m_pad + g * kc * kMr;
      float* acc_g = acc + (g - g0) * kMr * kNb;
      for (int p = 0; p < panels;) {
        prefetch.UpTo(++call);
        const QuantKernel kernel =
            p + kernels[mr - 1].panels <= panels ? kernels[mr - 1] : narrow[mr - 1];
        kernel.fn(xg, panel[p], layout.panel_bytes, kc, q.Panel(p), first, acc_g + p * kNr, kNb);
        p += kernel.panels;
      }
    }
  }
  WriteTile(acc, groups, g0, g1, n0, n1, bias, y, y_stride);
}

using BlockFn = void (*)(const float*, const RowGroups&, int64_t, int64_t, const WeightMatrix&,
                         int64_t, int64_t, const float*, float*, int64_t);

template <WeightLayout L>
BlockFn BlockFor(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return &Block<DType::kBF16, L>;
    case DType::kF16:
      return &Block<DType::kF16, L>;
    case DType::kF32:
    case DType::kI8:  // KV only: the loader refuses weights in any dtype but f32/f16/bf16
      break;
  }
  return &Block<DType::kF32, L>;
}

BlockFn BlockFor(const WeightMatrix& w) {
  if (w.layout == WeightLayout::kQuantPanels) {
    if (w.quant.bits == 8) return w.quant.has_zero ? &QuantBlock<8, true> : &QuantBlock<8, false>;
    return w.quant.has_zero ? &QuantBlock<4, true> : &QuantBlock<4, false>;
  }
  return w.layout == WeightLayout::kPanels ? BlockFor<WeightLayout::kPanels>(w.dtype)
                                           : BlockFor<WeightLayout::kRowMajor>(w.dtype);
}

}  // namespace

void GemmTiled(const float* x, int64_t m, int64_t x_stride, const WeightMatrix& w,
               const float* bias, float* y, int64_t y_stride, ThreadPool& pool) {
  const GemmOutput out{w, bias, y, y_stride};
  GemmTiledMulti(x, m, x_stride, {&out, 1}, pool);
}

void GemmTiledMulti(const float* x, int64_t m, int64_t x_stride,
                    std::span<const GemmOutput> outputs, ThreadPool& pool) {
  if (m <= 0 || outputs.empty()) return;
  // One packed x serves every output: outputs that read x differently go one by one.
  const XTransform transform = XTransform::Of(outputs.front().w);
  for (const auto& o : outputs) {
    if (XTransform::Of(o.w) == transform) continue;
    for (const auto& each : outputs) GemmTiledMulti(x, m, x_stride, {&each, 1}, pool);
    return;
  }
  const int64_t cols = outputs.front().w.cols;
  if (cols == 0) {
    for (const auto& o : outputs) {
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < o.w.rows; ++j) o.y[i * o.y_stride + j] = o.bias ? o.bias[j] : 0.0f;
      }
    }
    return;
  }
  // Work items are (weight block of one output, range of row groups), taken dynamically so a
  // slowed thread does not hold the other at the barrier. Splitting N alone reads every weight
  // once; M is split too only when there are too few blocks to keep every thread busy.
  const RowGroups groups(m);
  const int64_t threads = pool.num_threads();
  int64_t n_blocks = 0;
  for (const auto& o : outputs) n_blocks += (o.w.rows + kNb - 1) / kNb;
  int64_t m_parts = 1;
  if (n_blocks < 2 * threads) {
    m_parts = std::clamp<int64_t>((2 * threads + n_blocks - 1) / n_blocks, 1, groups.count);
  }
  const int64_t groups_per_part = (groups.count + m_parts - 1) / m_parts;
  // Owned by the calling thread; workers get the pointer (a thread_local named inside the
  // lambda would be each worker's own, empty buffer).
  thread_local std::vector<float> xp_buffer;
  const int64_t packed_x = groups.PaddedRows() * cols;
  if (static_cast<int64_t>(xp_buffer.size()) < packed_x) xp_buffer.resize(packed_x);
  const float* xp = xp_buffer.data();
  PackX(x, x_stride, cols, groups, transform, xp_buffer.data(), pool);
  pool.ParallelForDynamic(n_blocks * m_parts, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      int64_t nb = t / m_parts;
      const int64_t part = t % m_parts;
      const int64_t g0 = part * groups_per_part, g1 = std::min(groups.count, g0 + groups_per_part);
      if (g0 >= g1) continue;
      for (const auto& o : outputs) {
        const int64_t blocks = (o.w.rows + kNb - 1) / kNb;
        if (nb >= blocks) {
          nb -= blocks;
          continue;
        }
        const int64_t n0 = nb * kNb;
        BlockFor(o.w)(xp, groups, g0, g1, o.w, n0, std::min(o.w.rows, n0 + kNb), o.bias, o.y,
                      o.y_stride);
        break;
      }
    }
  });
}

bool UseAvx512QuantKernels(bool use) {
  use_avx512_quant.store(use && Avx512Available());
  return use && Avx512Available();
}

}  // namespace tandem::kernels::internal
