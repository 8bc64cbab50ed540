// Quantized panels (WeightLayout::kQuantPanels, quant_pack.h) against float x: the codes of a
// column become the exact integers code - zero in registers; a group's products with x sum in
// registers and are scaled once into the accumulator tile. Prefill converts each block to
// those integers (f32) once, as for bf16; both paths sum in the same order, so results do not
// depend on M.

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <utility>

#include "common/kernels/cpu/gemm_tiled_parts.h"
#include "common/kernels/cpu/quant_pack.h"

namespace tandem::kernels::internal {
namespace tiled {
namespace {

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
        _mm_prefetch(q.scales + j * q.panel_bytes + (group + q.group_step) * kNr * 4, _MM_HINT_T0);
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
constexpr std::array<QuantKernel, sizeof...(I)> MakeQuantKernels(std::integer_sequence<int, I...>) {
  return {QuantKernel{&QuantMicroKernel < kBits, kZero, kStream, I + 1,
                      kWide ? StreamPanels(I + 1) : 1 >, kWide ? StreamPanels(I + 1) : 1}...};
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
  if constexpr (kBits == 0) {  // panels converted to f32: nothing to subtract
    return _mm512_setzero_ps();
  } else if constexpr (kZero) {
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

// LoadUnit and UnitColumn with a panel column in one vector (kBits 0: a column of a panel
// converted to f32, its bits carried as they are).
template <int kBits, bool kZero>
TANDEM_AVX512 inline __m512i LoadUnit512(const uint8_t* codes, int64_t k) {
  if constexpr (kBits == 0) {
    return _mm512_castps_si512(_mm512_loadu_ps(reinterpret_cast<const float*>(codes) + k * kNr));
  } else if constexpr (kBits == 8) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + k * kNr));
    return kZero ? _mm512_cvtepu8_epi32(v) : _mm512_cvtepi8_epi32(v);
  } else {
    return _mm512_loadu_si512(codes + k * 8);
  }
}

template <int kBits, bool kZero>
TANDEM_AVX512 inline __m512 UnitColumn512(__m512i raw, int c, __m512 zf) {
  if constexpr (kBits == 0) {
    return _mm512_castsi512_ps(raw);
  } else if constexpr (kBits == 8) {
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
  constexpr int64_t kColumnBytes = kBits == 0 ? kNr * 4 : kNr * kBits / 8;
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

// Micro-panels a call: `panels` where given, else StreamPanels(mr) where wide, else 1.
constexpr int Panels512(int panels, bool wide, int mr) {
  return panels > 0 ? panels : wide ? StreamPanels(mr) : 1;
}
template <int kBits, bool kZero, bool kStream, bool kWide, int kPanels, int... I>
constexpr std::array<QuantKernel, sizeof...(I)> MakeQuantKernels512(
    std::integer_sequence<int, I...>) {
  return {QuantKernel{
      &QuantMicroKernel512<kBits, kZero, kStream, I + 1, Panels512(kPanels, kWide, I + 1)>,
      Panels512(kPanels, kWide, I + 1)}...};
}
template <int kBits, bool kZero, bool kStream = false, bool kWide = false, int kPanels = 0>
constexpr auto kQuantKernels512 = MakeQuantKernels512<kBits, kZero, kStream, kWide, kPanels>(
    std::make_integer_sequence<int, kMr>());
// Prefill on panels converted to f32, two micro-panels a call: 2 * MR chains of 16-lane FMAs
// (one 16-row column is one vector, so one panel alone would leave MR chains, too few).
constexpr int kF32Panels512 = 2;

std::atomic<bool> use_avx512_quant{Avx512Available()};

// Block() for quantized panels.
template <int kBits, bool kZero>
void QuantBlock(const PackedX& x, const RowGroups& groups, int64_t g0, int64_t g1,
                const WeightMatrix& w, int64_t n0, int64_t n1, const float* bias, float* y,
                int64_t y_stride) {
  constexpr int64_t kStreamMaxGroups = 2, kConvertMinGroups = 8;
  const bool stream = g1 - g0 <= kStreamMaxGroups;
  const bool to_f32 = g1 - g0 >= kConvertMinGroups;
  const bool avx512 = use_avx512_quant.load(std::memory_order_relaxed);
  const QuantKernel* narrow =
      to_f32 ? (avx512 ? kQuantKernels512<0, false>.data() : kQuantKernels<0, false>.data())
      : stream
          ? (avx512 ? kQuantKernels512<kBits, kZero, true>.data()
                    : kQuantKernels<kBits, kZero, true>.data())
          : (avx512 ? kQuantKernels512<kBits, kZero>.data() : kQuantKernels<kBits, kZero>.data());
  const QuantKernel* kernels = to_f32 && avx512
                                   ? kQuantKernels512<0, false, false, false, kF32Panels512>.data()
                               : !stream ? narrow
                               : avx512  ? kQuantKernels512<kBits, kZero, true, true>.data()
                                         : kQuantKernels<kBits, kZero, true, true>.data();
  float* acc = AccumulatorTile(g1 - g0);
  const int64_t m_pad = groups.PaddedRows();
  const int panels = static_cast<int>((n1 - n0 + kNr - 1) / kNr);
  const QuantPanelLayout layout = QuantPanelLayout::Of(w.quant, w.cols);
  const char* block_panels = static_cast<const char*>(w.data) + (n0 / kNr) * layout.panel_bytes;
  float* packed = to_f32 ? PackBuffer() : nullptr;
  // Between a call's micro-panels: the converted panels lie kKc columns apart.
  const int64_t panel_stride = to_f32 ? kKc * kNr * int64_t{sizeof(float)} : layout.panel_bytes;
  // Decode with a single group of x rows: x's K blocks lie end to end (PackX) and each panel is
  // read once front to back, so one call runs every K block. The sums and their order are those
  // of one call per K block (a segment never spans two K blocks).
  const bool whole_k = stream && groups.count == 1;
  for (int64_t k0 = 0, k1; k0 < w.cols; k0 = k1) {
    k1 = whole_k ? w.cols : std::min(w.cols, k0 + kKc);
    const int64_t kc = k1 - k0;
    const QuantBlockArgs q = BlockArgs(w, block_panels, k0);
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
      const float* xg = x.f + k0 * m_pad + g * kc * kMr;
      float* acc_g = acc + (g - g0) * kMr * kNb;
      for (int p = 0; p < panels;) {
        prefetch.UpTo(++call);
        const QuantKernel kernel =
            p + kernels[mr - 1].panels <= panels ? kernels[mr - 1] : narrow[mr - 1];
        kernel.fn(xg, panel[p], panel_stride, kc, q.Panel(p), first, acc_g + p * kNr, kNb);
        p += kernel.panels;
      }
    }
  }
  WriteTile(acc, groups, g0, g1, n0, n1, bias, y, y_stride);
}

}  // namespace

QuantBlockArgs BlockArgs(const WeightMatrix& w, const char* block_panels, int64_t k0) {
  const QuantPanelLayout layout = QuantPanelLayout::Of(w.quant, w.cols);
  const int64_t group_size = w.quant.group_size > 0 ? w.quant.group_size : w.cols;
  const bool one_group = group_size == w.cols;
  const int64_t first_group = one_group ? 0 : k0 / group_size;
  return QuantBlockArgs{
      .scales = block_panels + layout.scale_offset + first_group * kNr * 4,
      .zeros = block_panels + layout.zero_offset + first_group * kNr,
      .panel_bytes = layout.panel_bytes,
      .segment = one_group ? kKc : group_size,
      .group_step = one_group ? 0 : 1,
  };
}

BlockFn QuantBlockFor(const WeightMatrix& w) {
  if (w.quant.bits == 8) return w.quant.has_zero ? &QuantBlock<8, true> : &QuantBlock<8, false>;
  return w.quant.has_zero ? &QuantBlock<4, true> : &QuantBlock<4, false>;
}

std::string QuantKernelIsa() {
  return use_avx512_quant.load(std::memory_order_relaxed) ? "AVX-512" : "AVX2";
}

}  // namespace tiled

bool UseAvx512QuantKernels(bool use) {
  tiled::use_avx512_quant.store(use && tiled::Avx512Available());
  return use && tiled::Avx512Available();
}

}  // namespace tandem::kernels::internal
