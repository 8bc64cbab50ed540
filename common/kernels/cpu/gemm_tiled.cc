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
#include <string>
#include <utility>
#include <vector>

#include "common/kernels/cpu/gemm_internal.h"
#include "common/kernels/cpu/gemm_tiled_parts.h"
#include "common/kernels/cpu/int8_tiles.h"

namespace tandem::kernels::internal::tiled {
namespace {

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

template <DType P, bool kStream, bool kWide, int... I>
constexpr std::array<Kernel, sizeof...(I)> MakeKernels(std::integer_sequence<int, I...>) {
  return {Kernel{&MicroKernel < P, kStream, I + 1, kWide ? StreamPanels(I + 1) : 1 >,
                 kWide ? StreamPanels(I + 1) : 1}...};
}
// Indexed by MR - 1. Wide kernels take StreamPanels(MR) micro-panels per call.
template <DType P, bool kStream = false, bool kWide = false>
constexpr auto kKernels = MakeKernels<P, kStream, kWide>(std::make_integer_sequence<int, kMr>());

#define TANDEM_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))

// GCC 12 flags the intrinsics' own _mm512_undefined_* placeholders as (maybe-)uninitialized.
#if !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

// Column k of a micro-panel of dtype P as one 16-lane vector. bf16 panels hold row r in the low
// half of 32-bit lane r and row r + 8 in the high half of lane r (LoadPanelColumn), so widened
// to 32 bits lane 2r is row r and lane 2r + 1 row r + 8 (Bf16RowLanes undoes it at the store).
template <DType P>
TANDEM_AVX512 inline __m512 LoadPanelColumn16(const void* panel, int64_t k) {
  if constexpr (P == DType::kF32) {
    return _mm512_loadu_ps(static_cast<const float*>(panel) + k * kNr);
  } else {
    const __m256i v = _mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(panel) + k * kNr));
    if constexpr (P == DType::kBF16) {
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
    } else {
      return _mm512_cvtph_ps(v);
    }
  }
}

// Output row r's lane in a bf16 column (LoadPanelColumn16), as a permute index.
TANDEM_AVX512 inline __m512i Bf16RowLanes() {
  return _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
}

// MicroKernel (without kStream) with one 16-row column in one vector: each lane performs the
// 8-lane kernel's operations in the same order, so the same bits. Two micro-panels a call give
// 2 * MR chains of FMAs.
template <DType P, int MR, int NP>
TANDEM_AVX512 void MicroKernel16(const float* xp, const void* panel, int64_t panel_stride,
                                 int64_t kc, bool first, float* acc_out, int64_t acc_stride) {
  const char* panels[NP];
  TANDEM_UNROLL
  for (int j = 0; j < NP; ++j) panels[j] = static_cast<const char*>(panel) + j * panel_stride;
  __m512 acc[MR][NP];
  TANDEM_UNROLL
  for (int i = 0; i < MR; ++i) TANDEM_UNROLL
  for (int j = 0; j < NP; ++j) acc[i][j] = _mm512_setzero_ps();
#pragma GCC unroll 4
  for (int64_t k = 0; k < kc; ++k) {
    __m512 b[NP];
    TANDEM_UNROLL
    for (int j = 0; j < NP; ++j) b[j] = LoadPanelColumn16<P>(panels[j], k);
    TANDEM_UNROLL
    for (int i = 0; i < MR; ++i) {
      const __m512 a = _mm512_set1_ps(xp[k * kMr + i]);
      TANDEM_UNROLL
      for (int j = 0; j < NP; ++j) acc[i][j] = _mm512_fmadd_ps(a, b[j], acc[i][j]);
    }
  }
  TANDEM_UNROLL
  for (int i = 0; i < MR; ++i) TANDEM_UNROLL
  for (int j = 0; j < NP; ++j) {
    float* out = acc_out + i * acc_stride + j * kNr;
    const __m512 sum =
        P == DType::kBF16 ? _mm512_permutexvar_ps(Bf16RowLanes(), acc[i][j]) : acc[i][j];
    _mm512_storeu_ps(out, first ? sum : _mm512_add_ps(sum, _mm512_loadu_ps(out)));
  }
}

#if !defined(__clang__)
#pragma GCC diagnostic pop
#endif

template <DType P, int NP, int... I>
constexpr std::array<Kernel, sizeof...(I)> MakeKernels16(std::integer_sequence<int, I...>) {
  return {Kernel{&MicroKernel16<P, I + 1, NP>, NP}...};
}
// Indexed by MR - 1, NP micro-panels a call.
template <DType P, int NP>
constexpr auto kKernels16 = MakeKernels16<P, NP>(std::make_integer_sequence<int, kMr>());

std::atomic<bool> use_avx512_panels{Avx512Available()};

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

// How the GEMM reads x for a quantized matrix: its columns in the panels' order, each row
// rounded to int8 for a format with int8 activations, and packed for the integer kernels
// where they run the matrix (see WeightMatrix::input_order, QuantFormat, IntSubBlock).
struct XTransform {
  const int32_t* order = nullptr;
  bool int8 = false;
  int64_t block = 0;  // int8: columns per activation scale, 0 for the whole row
  int64_t sub = 0;    // int8: the integer kernels' sub-block; 0: float kernels
  bool quads = false;  // int8: the integer kernels read x as quads too

  static XTransform Of(const WeightMatrix& w) {
    if (w.layout != WeightLayout::kQuantPanels) return {};
    if (!w.quant.int8_activations) return {w.input_order};
    const int64_t sub = IntSubBlock(w);
    return {w.input_order, true, w.quant.activation_block, sub, sub > 0 && IntWantsQuads(w)};
  }
  bool operator==(const XTransform&) const = default;
};

// Row `src` of x as the float kernels multiply it: gathered through t.order, each activation
// block rounded to int8 and back when t.int8.
void TransformRow(const float* src, int64_t k, const XTransform& t, float* out) {
  for (int64_t j = 0; j < k; ++j) out[j] = src[t.order ? t.order[j] : j];
  if (!t.int8) return;
  thread_local std::vector<int8_t> codes;
  const int64_t block = t.block > 0 ? t.block : k;
  if (static_cast<int64_t>(codes.size()) < block) codes.resize(block);
  for (int64_t b0 = 0; b0 < k; b0 += block) {
    const int64_t n = std::min(block, k - b0);
    const float scale = RoundToInt8(out + b0, n, codes.data());
    for (int64_t j = 0; j < n; ++j) out[b0 + j] = codes[j] * scale;
  }
}

// Packs x group by group, each group's rows k-major (kMr slots per k) within
// each K block of kKc columns, the groups of one K block contiguous: row Start(g) + i, column
// k0 + kk lands at xp[k0 * m_pad + (g * kc + kk) * kMr + i] (m_pad: PaddedRows(); kc: the
// block's width). Unpacked, the rows of a microkernel sit a multiple of 4 KiB apart for typical
// K and fight over the same L1 sets; blocked by K, the microkernels of one K block read x as a
// single sequential stream. A transform `t` is applied to each row first. A group of r rows
// runs the microkernels for r rows, which read no other slot: the unused ones are left as they
// are (at batch 1, writing them was 5/6 of the packing).
void PackX(const float* x, int64_t x_stride, int64_t k, const RowGroups& groups,
           const XTransform& t, float* xp, ThreadPool& pool) {
  const int64_t m_pad = groups.PaddedRows();
  const bool transform = t.order != nullptr || t.int8;
  auto pack = [&](int64_t g0, int64_t g1) {
    thread_local std::vector<float> row;
    if (transform && static_cast<int64_t>(row.size()) < k) row.resize(k);
    for (int64_t g = g0; g < g1; ++g) {
      for (int i = 0; i < groups.Size(g); ++i) {
        const float* src = x + (groups.Start(g) + i) * x_stride;
        if (transform) {
          TransformRow(src, k, t, row.data());
          src = row.data();
        }
        for (int64_t k0 = 0; k0 < k; k0 += kKc) {
          const int64_t kc = std::min(kKc, k - k0);
          float* dst = xp + k0 * m_pad + g * kc * kMr + i;
          for (int64_t kk = 0; kk < kc; ++kk) dst[kk * kMr] = src[k0 + kk];
        }
      }
    }
  };
  // A decode step's few rows are not worth waking the pool for.
  constexpr int64_t kGrain = 8;
  if (groups.count <= kGrain) return pack(0, groups.count);
  pool.ParallelFor(groups.count, kGrain, pack);
}

}  // namespace

bool Avx512Available() {
  __builtin_cpu_init();  // this may run before the runtime's own initialization
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

// Thread-local so each worker packs into its own L2-resident buffer without allocating.
float* PackBuffer() {
  thread_local std::vector<float> buffer(kNb * kKc);
  return buffer.data();
}

float* AccumulatorTile(int64_t row_groups) {
  thread_local std::vector<float> buffer;
  const int64_t floats = row_groups * kMr * kNb;
  if (static_cast<int64_t>(buffer.size()) < floats) buffer.resize(floats);
  return buffer.data();
}

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

namespace {

// Computes y[rows of groups g0..g1, n0:n1] for one work item; n1 - n0 <= kNb and n0 is a
// multiple of kNb. x.f is x packed by PackX. The sums build up over the K blocks in a contiguous
// thread-local tile and are written to y once at the end: y's own rows lie N floats apart, a
// power of two for most models, so the rows of a tile would share cache sets and be refetched
// from L3 on every K block (measured: 20% of the GEMM's time).
template <DType T, WeightLayout L>
void Block(const PackedX& x, const RowGroups& groups, int64_t g0, int64_t g1, const WeightMatrix& w,
           int64_t n0, int64_t n1, const float* bias, float* y, int64_t y_stride) {
  constexpr bool kPrepacked = L == WeightLayout::kPanels;
  constexpr int64_t kElem = DTypeSize(T);
  // Panels packed at load are read in place, converted in registers. Few rows of x (decode)
  // stream them straight from memory; many rows (prefill) reuse each block so often that
  // converting it to f32 once beats converting it in every microkernel.
  constexpr int64_t kStreamMaxGroups = 2, kConvertMinGroups = 8;
  const bool stream = kPrepacked && g1 - g0 <= kStreamMaxGroups;
  const bool to_f32 = !kPrepacked || (T != DType::kF32 && g1 - g0 >= kConvertMinGroups);
  // 16 lanes where the CPU has AVX-512, two micro-panels a call (one for a block's odd last
  // panel), for every call but decode's streams: those are bound by memory, and a 16-lane
  // stream kernel measured no faster at batches of 1 and 8 (the same bits either way).
  const bool avx512 = !stream && use_avx512_panels.load(std::memory_order_relaxed);
  const Kernel* narrow =
      to_f32   ? (avx512 ? kKernels16<DType::kF32, 1>.data() : kKernels<DType::kF32>.data())
      : stream ? kKernels<T, true>.data()
               : (avx512 ? kKernels16<T, 1>.data() : kKernels<T>.data());
  const Kernel* kernels = stream    ? kKernels<T, true, true>.data()
                          : !avx512 ? narrow
                          : to_f32  ? kKernels16<DType::kF32, 2>.data()
                                    : kKernels16<T, 2>.data();
  float* acc = AccumulatorTile(g1 - g0);
  const int64_t m_pad = groups.PaddedRows();
  const int panels = static_cast<int>((n1 - n0 + kNr - 1) / kNr);
  const char* base = static_cast<const char*>(w.data);
  // Packed at load, a panel is kNr rows x all columns; converted or packed per call, kKc
  // columns.
  const int64_t panel_bytes = w.cols * kNr * kElem;
  const int64_t kernel_stride = to_f32 ? kKc * kNr * int64_t{sizeof(float)} : panel_bytes;
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
      const float* xg = x.f + k0 * m_pad + g * kc * kMr;
      float* acc_g = acc + (g - g0) * kMr * kNb;
      for (int p = 0; p < panels;) {
        prefetch.UpTo(++call);
        // A block at the end of a matrix may hold fewer panels than a wide kernel takes.
        const Kernel kernel =
            p + kernels[mr - 1].panels <= panels ? kernels[mr - 1] : narrow[mr - 1];
        kernel.fn(xg, panel[p], kernel_stride, kc, first, acc_g + p * kNr, kNb);
        p += kernel.panels;
      }
    }
  }
  WriteTile(acc, groups, g0, g1, n0, n1, bias, y, y_stride);
}

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

BlockFn BlockFor(const WeightMatrix& w, const XTransform& t) {
  if (w.layout == WeightLayout::kQuantPanels) return t.sub > 0 ? IntBlockFor(w) : QuantBlockFor(w);
  return w.layout == WeightLayout::kPanels ? BlockFor<WeightLayout::kPanels>(w.dtype)
                                           : BlockFor<WeightLayout::kRowMajor>(w.dtype);
}

}  // namespace

void Run(const float* x, int64_t m, int64_t x_stride, std::span<const GemmOutput> outputs,
         ThreadPool& pool) {
  if (m <= 0 || outputs.empty()) return;
  // One packed x serves every output: outputs that read x differently go one by one.
  const XTransform transform = XTransform::Of(outputs.front().w);
  for (const auto& o : outputs) {
    if (XTransform::Of(o.w) == transform) continue;
    for (const auto& each : outputs) Run(x, m, x_stride, {&each, 1}, pool);
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
  PackedX xp;
  if (transform.sub > 0) {
    xp = PackXInt8(x, x_stride, cols, groups, transform.order, transform.block, transform.sub,
                   transform.quads, pool);
  } else {
    thread_local std::vector<float> xp_buffer;
    const int64_t packed_x = groups.PaddedRows() * cols;
    if (static_cast<int64_t>(xp_buffer.size()) < packed_x) xp_buffer.resize(packed_x);
    PackX(x, x_stride, cols, groups, transform, xp_buffer.data(), pool);
    xp.f = xp_buffer.data();
  }
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
        BlockFor(o.w, transform)(xp, groups, g0, g1, o.w, n0, std::min(o.w.rows, n0 + kNb), o.bias,
                                 o.y, o.y_stride);
        break;
      }
    }
  });
}

}  // namespace tandem::kernels::internal::tiled

namespace tandem::kernels::internal {

void GemmTiled(const float* x, int64_t m, int64_t x_stride, const WeightMatrix& w,
               const float* bias, float* y, int64_t y_stride, ThreadPool& pool) {
  const GemmOutput out{w, bias, y, y_stride};
  tiled::Run(x, m, x_stride, {&out, 1}, pool);
}

void GemmTiledMulti(const float* x, int64_t m, int64_t x_stride,
                    std::span<const GemmOutput> outputs, ThreadPool& pool) {
  tiled::Run(x, m, x_stride, outputs, pool);
}

bool UseAvx512PanelKernels(bool use) {
  tiled::use_avx512_panels.store(use && tiled::Avx512Available());
  return use && tiled::Avx512Available();
}

}  // namespace tandem::kernels::internal

namespace tandem::kernels {

std::string QuantKernelName(const WeightMatrix& w) {
  if (w.layout == WeightLayout::kInt8Tiles) return Int8TilesKernelName();
  if (w.layout != WeightLayout::kQuantPanels) return "";
  if (w.quant.int8_activations && internal::tiled::IntSubBlock(w) > 0) {
    return "integer (" + internal::tiled::IntKernelIsa(w) + ")";
  }
  // (with int8 activations here, x is rounded to int8 and back, and the float kernels run)
  return "float (codes to f32 in registers, " + internal::tiled::QuantKernelIsa() +
         (w.quant.int8_activations ? "; int8 activations rounded)" : ")");
}

}  // namespace tandem::kernels
