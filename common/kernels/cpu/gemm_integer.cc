// Integer kernels for quantized weights with int8 activations (QuantFormat::int8_activations),
// on AVX512-VNNI and else on 256-bit vectors: 4-bit codes in Avx2MicroKernel, 8-bit codes in
// Avx2Int8MicroKernel, each with AVX-VNNI's vpdpbusd where the CPU has it, else on AVX2.
// On AVX512-VNNI, vpdpbusd multiplies
// 4 unsigned weight codes by 4 signed x codes and adds the products into a 32-bit lane, 64 products
// per instruction where an f32 FMA does 16, and the codes need no conversion to floats. A lane is
// one weight row of a panel; a unit of 8 columns gives two vectors of codes, the even columns (0,
// 2, 4, 6) and the odd ones, which meet x's codes packed in that order (PackXInt8):
//   4 bits  the unit's 64 bytes hold row r's 8 nibbles in lane r (quant_pack.h): the low
//           nibbles of its bytes (mask 0x0F) are the even columns, the high nibbles the odd.
//   8 bits  columns k..k+3 and k+4..k+7 are two 64-byte loads of 16 rows each; one vpermt2b
//           gathers each row's even columns into its lane, another the odd ones. Symmetric
//           codes are stored as code - 128 (quant_pack.h) and flipped back to the code.
// A sub-block of a group's columns sums exactly in int32: sum (code - zero) x_q =
// sum code x_q - zero sum x_q, with sum x_q packed beside x. Each sub-block's sum is converted
// to f32 and scaled by x's scale for it, the group's sum is scaled by the group's scale into
// the tile: the same operations in the same order at every M, so decode, prefill and any
// batch give a row the same bits.

#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <utility>
#include <vector>

#include "common/kernels/cpu/gemm_tiled_parts.h"
#include "common/kernels/cpu/quant_pack.h"

namespace tandem::kernels::internal {
namespace tiled {

namespace {

#define TANDEM_VNNI \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512vbmi")))
// GCC 12 flags the intrinsics' own _mm512_undefined_* placeholders as maybe-uninitialized.
#if !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

constexpr int64_t kUnit = 8;  // columns per unit: one 4-bit load, two 8-bit loads

// Where column c of a unit sits among a row's 8 packed x codes: even columns first.
constexpr int XPosition(int c) { return c % 2 * 4 + c / 2; }

// x for one row group at one K block (see PackedX).
struct IntX {
  const int8_t* q;      // [unit][kMr][8]
  const int32_t* sums;  // [sub-block][kMr]
  const float* scales;  // [sub-block][kMr]
  int64_t sub;
  const int32_t* quads;  // [unit][kMr][8] (Avx2Int8MicroKernel only)
};

// vpermt2b indices gathering row r's column 2c + odd (c = 0..3) of a unit's two 8-bit loads
// (column j of the unit at byte 16 j + r of their 128 bytes) into byte c of lane r.
template <int kOdd>
TANDEM_VNNI inline __m512i GatherIndex() {
  alignas(64) static constexpr auto kIndex = [] {
    std::array<uint8_t, 64> index{};
    for (int r = 0; r < 16; ++r) {
      for (int c = 0; c < 4; ++c) index[4 * r + c] = static_cast<uint8_t>((2 * c + kOdd) * 16 + r);
    }
    return index;
  }();
  return _mm512_load_si512(kIndex.data());
}

// The codes of the unit at column k of a panel as unsigned bytes, even and odd columns.
template <int kBits, bool kZero>
TANDEM_VNNI inline void LoadCodes(const char* panel, int64_t k, __m512i& even, __m512i& odd) {
  if constexpr (kBits == 4) {
    const __m512i raw = _mm512_loadu_si512(panel + k * 8);
    const __m512i low = _mm512_set1_epi8(0x0F);
    even = _mm512_and_si512(raw, low);
    odd = _mm512_and_si512(_mm512_srli_epi32(raw, 4), low);
  } else {
    const __m512i a = _mm512_loadu_si512(panel + k * 16);
    const __m512i b = _mm512_loadu_si512(panel + k * 16 + 64);
    even = _mm512_permutex2var_epi8(a, GatherIndex<0>(), b);
    odd = _mm512_permutex2var_epi8(a, GatherIndex<1>(), b);
    if constexpr (!kZero) {
      even = _mm512_xor_si512(even, _mm512_set1_epi8(-128));
      odd = _mm512_xor_si512(odd, _mm512_set1_epi8(-128));
    }
  }
}

inline int32_t Load4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// acc[0:MR, 0:NP*kNr] (+)= x^T * (codes - zeros) * scales over kc columns of NP panels (see
// QuantMicroKernel in gemm_quant.cc for `q`, `first` and kStream).
template <int kBits, bool kZero, bool kStream, int MR, int NP>
TANDEM_VNNI void VnniMicroKernel(const IntX& x, const void* panel, int64_t panel_stride, int64_t kc,
                                 const QuantBlockArgs& q, bool first, float* acc_out,
                                 int64_t acc_stride) {
  constexpr int64_t kUnitBytes = kBits * 16;
  const char* panels[NP];
  TANDEM_UNROLL
  for (int j = 0; j < NP; ++j) panels[j] = static_cast<const char*>(panel) + j * panel_stride;
  for (int64_t s0 = 0, seg = 0; s0 < kc; s0 += q.segment, ++seg) {
    const int64_t group = seg * q.group_step;
    const int64_t s1 = std::min(kc, s0 + q.segment);
    __m512i zero[NP];
    __m512 facc[MR][NP];
    TANDEM_UNROLL
    for (int j = 0; j < NP; ++j) {
      if constexpr (kZero) {
        zero[j] = _mm512_cvtepu8_epi32(_mm_loadu_si128(
            reinterpret_cast<const __m128i*>(q.zeros + j * q.panel_bytes + group * kNr)));
      }
      if constexpr (kStream) {  // the next group's scales (and zeros), which follow these
        _mm_prefetch(q.scales + j * q.panel_bytes + (group + q.group_step) * kNr * 4, _MM_HINT_T0);
        if constexpr (kZero) {
          _mm_prefetch(q.zeros + j * q.panel_bytes + (group + q.group_step) * kNr, _MM_HINT_T0);
        }
      }
      TANDEM_UNROLL
      for (int i = 0; i < MR; ++i) facc[i][j] = _mm512_setzero_ps();
    }
    for (int64_t b0 = s0, b = s0 / x.sub; b0 < s1; b0 += x.sub, ++b) {
      const int64_t b1 = std::min(s1, b0 + x.sub);
      // Even and odd columns in separate sums: twice the independent chains.
      __m512i iacc[MR][NP][2];
      TANDEM_UNROLL
      for (int i = 0; i < MR; ++i) TANDEM_UNROLL
      for (int j = 0; j < NP; ++j) iacc[i][j][0] = iacc[i][j][1] = _mm512_setzero_si512();
#pragma GCC unroll 4
      for (int64_t k = b0; k < b1; k += kUnit) {
        if constexpr (kStream) {
          TANDEM_UNROLL
          for (int j = 0; j < NP; ++j) {
            TANDEM_UNROLL
            for (int64_t line = 0; line < kUnitBytes; line += 64) {
              _mm_prefetch(panels[j] + k * kUnitBytes / kUnit + line + q.ahead, _MM_HINT_T0);
            }
          }
        }
        const int8_t* xq = x.q + k / kUnit * kMr * kUnit;
        TANDEM_UNROLL
        for (int j = 0; j < NP; ++j) {
          __m512i even, odd;
          LoadCodes<kBits, kZero>(panels[j], k, even, odd);
          TANDEM_UNROLL
          for (int i = 0; i < MR; ++i) {
            iacc[i][j][0] =
                _mm512_dpbusd_epi32(iacc[i][j][0], even, _mm512_set1_epi32(Load4(xq + i * kUnit)));
            iacc[i][j][1] = _mm512_dpbusd_epi32(iacc[i][j][1], odd,
                                                _mm512_set1_epi32(Load4(xq + i * kUnit + 4)));
          }
        }
      }
      TANDEM_UNROLL
      for (int i = 0; i < MR; ++i) {
        const int32_t sum = x.sums[b * kMr + i];
        const __m512 scale = _mm512_set1_ps(x.scales[b * kMr + i]);
        TANDEM_UNROLL
        for (int j = 0; j < NP; ++j) {
          __m512i t = _mm512_add_epi32(iacc[i][j][0], iacc[i][j][1]);
          t = kZero ? _mm512_sub_epi32(t, _mm512_mullo_epi32(zero[j], _mm512_set1_epi32(sum)))
                    : _mm512_sub_epi32(t, _mm512_set1_epi32(sum * (1 << (kBits - 1))));
          facc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), scale, facc[i][j]);
        }
      }
    }
    const bool store = first && s0 == 0;
    TANDEM_UNROLL
    for (int j = 0; j < NP; ++j) {
      const __m512 s = _mm512_loadu_ps(
          reinterpret_cast<const float*>(q.scales + j * q.panel_bytes) + group * kNr);
      TANDEM_UNROLL
      for (int i = 0; i < MR; ++i) {
        float* out = acc_out + i * acc_stride + j * kNr;
        _mm512_storeu_ps(out, store ? _mm512_mul_ps(facc[i][j], s)
                                    : _mm512_fmadd_ps(facc[i][j], s, _mm512_loadu_ps(out)));
      }
    }
  }
}

#if !defined(__clang__)
#pragma GCC diagnostic pop
#endif

// acc plus the products of u8's unsigned and s8's signed bytes, four to each 32-bit lane
// (AVX-VNNI's vpdpbusd). In asm: the AVX2 kernels are compiled for AVX2 alone, and the
// intrinsic would need the whole kernel under a target attribute.
inline __m256i DotQuads(__m256i acc, __m256i u8, __m256i s8) {
  asm("%{vex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(u8), "x"(s8));
  return acc;
}

// acc plus the products of w's and x's signed bytes, four to each 32-bit lane, on plain AVX2:
// vpmaddubsw multiplies |w| (unsigned) by x with w's sign, and with x's codes within +-127 a
// pair sums to at most 2 * 128 * 127 = 32512, exact in 16 bits; vpmaddwd adds the pairs.
inline __m256i DotQuadsSigned(__m256i acc, __m256i w, __m256i x) {
  const __m256i pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(x, w));
  return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}

// The start of a pass over half a panel's rows in the 256-bit kernels (Avx2MicroKernel,
// Avx2Int8Rows): load the half's zero points, prefetch the next group's scales and zeros on the
// first half, and clear the float sums.
template <bool kZero, bool kStream, int MR, int NP>
inline void StartHalf(const QuantBlockArgs& q, int64_t group, int h, __m256i (&zero)[NP],
                      __m256 (&facc)[MR][NP]) {
  constexpr int kHalf = kNr / 2;
  TANDEM_UNROLL
  for (int j = 0; j < NP; ++j) {
    if constexpr (kZero) {
      zero[j] = _mm256_cvtepu8_epi32(_mm_loadl_epi64(
          reinterpret_cast<const __m128i*>(q.zeros + j * q.panel_bytes + group * kNr + kHalf * h)));
    }
    if (kStream && h == 0) {
      _mm_prefetch(q.scales + j * q.panel_bytes + (group + q.group_step) * kNr * 4, _MM_HINT_T0);
      if constexpr (kZero) {
        _mm_prefetch(q.zeros + j * q.panel_bytes + (group + q.group_step) * kNr, _MM_HINT_T0);
      }
    }
    TANDEM_UNROLL
    for (int i = 0; i < MR; ++i) facc[i][j] = _mm256_setzero_ps();
  }
}

// acc plus a sub-block's integer sum t with the codes' offset taken out (the zero point, or
// the symmetric midpoint mid, times the sum of x's codes), times x's scale.
template <bool kZero>
inline __m256 AddScaledSum(__m256 acc, __m256i t, const __m256i& zero, int32_t x_sum, int32_t mid,
                           __m256 x_scale) {
  t = kZero ? _mm256_sub_epi32(t, _mm256_mullo_epi32(zero, _mm256_set1_epi32(x_sum)))
            : _mm256_sub_epi32(t, _mm256_set1_epi32(x_sum * mid));
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), x_scale, acc);
}

// The end of that pass: the half's float sums times the group's weight scales, stored into the
// tile (the segment's first) or added to it.
template <int MR, int NP>
inline void FinishHalf(const QuantBlockArgs& q, int64_t group, int h, bool store,
                       const __m256 (&facc)[MR][NP], float* acc_out, int64_t acc_stride) {
  constexpr int kHalf = kNr / 2;
  TANDEM_UNROLL
  for (int j = 0; j < NP; ++j) {
    const __m256 s = _mm256_loadu_ps(reinterpret_cast<const float*>(q.scales + j * q.panel_bytes) +
                                     group * kNr + kHalf * h);
    TANDEM_UNROLL
    for (int i = 0; i < MR; ++i) {
      float* out = acc_out + i * acc_stride + j * kNr + kHalf * h;
      _mm256_storeu_ps(out, store ? _mm256_mul_ps(facc[i][j], s)
                                  : _mm256_fmadd_ps(facc[i][j], s, _mm256_loadu_ps(out)));
    }
  }
}

// sum16 plus `units` units of 4-bit codes from src (one half of each panel's rows, 64 bytes a
// unit) times x's codes at xq (kMr * kUnit a unit); kPrefetch: fetch `ahead` bytes ahead.
// The pointers step by a unit, which keeps the loop's scalar work to a few adds.
template <bool kPrefetch, bool kVnni, int MR, int NP>
inline void SumUnits4(const int8_t* xq, const char* (&src)[NP], int64_t units, int64_t ahead,
                      __m256i (&sum16)[MR][NP]) {
  const __m256i low = _mm256_set1_epi8(0x0F);
#pragma GCC unroll 4
  for (int64_t u = 0; u < units; ++u, xq += kMr * kUnit) {
    TANDEM_UNROLL
    for (int j = 0; j < NP; ++j) {
      if constexpr (kPrefetch) _mm_prefetch(src[j] + ahead, _MM_HINT_T0);
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src[j]));
      src[j] += 64;
      const __m256i even = _mm256_and_si256(raw, low);
      const __m256i odd = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
      TANDEM_UNROLL
      for (int i = 0; i < MR; ++i) {
        const __m256i xe = _mm256_set1_epi32(Load4(xq + i * kUnit));
        const __m256i xo = _mm256_set1_epi32(Load4(xq + i * kUnit + 4));
        if constexpr (kVnni) {
          sum16[i][j] = DotQuads(DotQuads(sum16[i][j], even, xe), odd, xo);
        } else {
          const __m256i products =
              _mm256_add_epi16(_mm256_maddubs_epi16(even, xe), _mm256_maddubs_epi16(odd, xo));
          sum16[i][j] = _mm256_add_epi16(sum16[i][j], products);
        }
      }
    }
  }
}

// Avx2MicroKernel for one row of x (batch-1 decode): both halves of each unit in one pass, so
// a cache line is used whole as it arrives, x's codes are broadcast once a unit, and no second
// pass over L1 leaves the prefetches idle for half the time. Its 16 accumulators (8 sums, 8
// float sums) would not leave room for more rows. The same sums in the same order as the two
// passes: the same bits. On Zen 3 it streams the codes ~1.1x as fast (docs/benchmarks.md).
template <bool kZero, bool kStream, bool kVnni, int NP>
void Avx2RowKernel(const IntX& x, const void* panel, int64_t panel_stride, int64_t kc,
                   const QuantBlockArgs& q, bool first, float* acc_out, int64_t acc_stride) {
  const char* src[NP];
  TANDEM_UNROLL
  for (int j = 0; j < NP; ++j) src[j] = static_cast<const char*>(panel) + j * panel_stride;
  const __m256i ones = _mm256_set1_epi16(1), low = _mm256_set1_epi8(0x0F);
  const int8_t* xq = x.q;
  for (int64_t s0 = 0, seg = 0; s0 < kc; s0 += q.segment, ++seg) {
    const int64_t group = seg * q.group_step;
    const int64_t s1 = std::min(kc, s0 + q.segment);
    const bool store = first && s0 == 0;
    __m256i zero[2][NP];
    __m256 facc[2][1][NP];
    StartHalf<kZero, kStream, 1, NP>(q, group, 0, zero[0], facc[0]);
    StartHalf<kZero, false, 1, NP>(q, group, 1, zero[1], facc[1]);
    for (int64_t b0 = s0, b = s0 / x.sub; b0 < s1; b0 += x.sub, ++b) {
      const int64_t b1 = std::min(s1, b0 + x.sub);
      __m256i sum16[2][NP];
      TANDEM_UNROLL
      for (int j = 0; j < NP; ++j) sum16[0][j] = sum16[1][j] = _mm256_setzero_si256();
#pragma GCC unroll 4
      for (int64_t k = b0; k < b1; k += kUnit, xq += kMr * kUnit) {
        const __m256i xe = _mm256_set1_epi32(Load4(xq));
        const __m256i xo = _mm256_set1_epi32(Load4(xq + 4));
        TANDEM_UNROLL
        for (int j = 0; j < NP; ++j) {
          if constexpr (kStream) _mm_prefetch(src[j] + q.ahead, _MM_HINT_T0);
          TANDEM_UNROLL
          for (int h = 0; h < 2; ++h) {
            const __m256i raw =
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src[j] + 32 * h));
            const __m256i even = _mm256_and_si256(raw, low);
            const __m256i odd = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
            if constexpr (kVnni) {
              sum16[h][j] = DotQuads(DotQuads(sum16[h][j], even, xe), odd, xo);
            } else {
              sum16[h][j] = _mm256_add_epi16(
                  sum16[h][j],
                  _mm256_add_epi16(_mm256_maddubs_epi16(even, xe), _mm256_maddubs_epi16(odd, xo)));
            }
          }
          src[j] += 64;
        }
      }
      const int32_t sum = x.sums[b * kMr];
      const __m256 scale = _mm256_set1_ps(x.scales[b * kMr]);
      TANDEM_UNROLL
      for (int h = 0; h < 2; ++h) {
        TANDEM_UNROLL
        for (int j = 0; j < NP; ++j) {
          __m256i t = kVnni ? sum16[h][j] : _mm256_madd_epi16(sum16[h][j], ones);
          facc[h][0][j] = AddScaledSum<kZero>(facc[h][0][j], t, zero[h][j], sum, 8, scale);
        }
      }
    }
    FinishHalf<1, NP>(q, group, 0, store, facc[0], acc_out, acc_stride);
    FinishHalf<1, NP>(q, group, 1, store, facc[1], acc_out, acc_stride);
  }
}

// VnniMicroKernel for 4-bit codes on AVX2, 8 rows (half a panel) per vector: vpmaddubsw
// multiplies 32 unsigned codes by 32 signed x codes and adds pairs into 16-bit lanes. A unit
// adds at most 4 * 15 * 127 = 7620 to a 16-bit lane, so a sub-block of up to 4 units (32
// columns) sums exactly in 16 bits before vpmaddwd widens it, and every sub-block's int32 sum
// equals the AVX-512 kernel's: both give the same bits. (8-bit codes would overflow the pair
// sums; see Avx2Int8MicroKernel.) Each half of the panels is one pass over the
// segment, which keeps the accumulators in 16 registers; the second pass reads from L1 (one
// row of x runs Avx2RowKernel instead). With AVX-VNNI (kVnni), vpdpbusd sums each lane's four
// products straight into 32 bits: the same sums.
template <bool kZero, bool kStream, bool kVnni, int MR, int NP>
void Avx2MicroKernel(const IntX& x, const void* panel, int64_t panel_stride, int64_t kc,
                     const QuantBlockArgs& q, bool first, float* acc_out, int64_t acc_stride) {
  if constexpr (MR == 1) {
    return Avx2RowKernel<kZero, kStream, kVnni, NP>(x, panel, panel_stride, kc, q, first, acc_out,
                                                    acc_stride);
  }
  const char* panels[NP];
  TANDEM_UNROLL
  for (int j = 0; j < NP; ++j) panels[j] = static_cast<const char*>(panel) + j * panel_stride;
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t s0 = 0, seg = 0; s0 < kc; s0 += q.segment, ++seg) {
    const int64_t group = seg * q.group_step;
    const int64_t s1 = std::min(kc, s0 + q.segment);
    const bool store = first && s0 == 0;
    for (int h = 0; h < 2; ++h) {
      __m256i zero[NP];
      __m256 facc[MR][NP];
      StartHalf<kZero, kStream, MR, NP>(q, group, h, zero, facc);
      const char* src[NP];
      TANDEM_UNROLL
      for (int j = 0; j < NP; ++j) src[j] = panels[j] + s0 * 8 + 32 * h;
      for (int64_t b0 = s0, b = s0 / x.sub; b0 < s1; b0 += x.sub, ++b) {
        const int64_t b1 = std::min(s1, b0 + x.sub);
        __m256i sum16[MR][NP];
        TANDEM_UNROLL
        for (int i = 0; i < MR; ++i) TANDEM_UNROLL
        for (int j = 0; j < NP; ++j) sum16[i][j] = _mm256_setzero_si256();
        const int8_t* xq = x.q + b0 / kUnit * kMr * kUnit;
        const int64_t units = (b1 - b0 + kUnit - 1) / kUnit;
        if (kStream && h == 0) {
          SumUnits4<true, kVnni, MR, NP>(xq, src, units, q.ahead, sum16);
        } else {
          SumUnits4<false, kVnni, MR, NP>(xq, src, units, q.ahead, sum16);
        }
        TANDEM_UNROLL
        for (int i = 0; i < MR; ++i) {
          const int32_t sum = x.sums[b * kMr + i];
          const __m256 scale = _mm256_set1_ps(x.scales[b * kMr + i]);
          TANDEM_UNROLL
          for (int j = 0; j < NP; ++j) {
            // (with AVX-VNNI, sum16 holds 32-bit sums already)
            __m256i t = kVnni ? sum16[i][j] : _mm256_madd_epi16(sum16[i][j], ones);
            facc[i][j] = AddScaledSum<kZero>(facc[i][j], t, zero[j], sum, 8, scale);
          }
        }
      }
      FinishHalf<MR, NP>(q, group, h, store, facc, acc_out, acc_stride);
    }
  }
}

// VnniMicroKernel for 8-bit codes on AVX-VNNI (vpdpbusd on 256-bit vectors; without it, kVnni
// false, the sign trick of DotQuadsSigned on the codes less 128), 8 rows per pass
// as in Avx2MicroKernel. A unit's four 32-byte loads hold columns (0 | 1), (2 | 3), (4 | 5) and
// (6 | 7) of 16 rows, a column to a 128-bit lane. vpunpcklbw of the first two pairs row r's
// columns 0 and 2 in the low lane and 1 and 3 in the high one, for rows 0-7 (vpunpckhbw: rows
// 8-15), and of the last two columns 4 and 6, 5 and 7; vpunpck{l,h}wd of the two gives each
// row's 4 even columns a 32-bit lane in the low half and its odd ones in the high half, rows
// 0-3 and 4-7, to meet x's codes (PackedX::quads: x0 x2 x4 x6 | x1 x3 x5 x7). The same sums
// as the AVX-512 kernel, so a row gets the same bits; a pass sums rows 0-3 and 4-7 in two
// vectors, folded into one at the end of each sub-block. Up to 4 rows of x at a time keep the
// sums in registers (Avx2Int8MicroKernel). On plain AVX2 the codes less 128 (symmetric codes
// are stored that way) multiply x's codes exactly (DotQuadsSigned), and 128 times the sum of
// x's codes added back gives the same int32 sum as vpdpbusd's: the same bits again.
template <bool kZero, bool kStream, bool kVnni, int MR, int NP>
void Avx2Int8Rows(const IntX& x, const void* panel, int64_t panel_stride, int64_t kc,
                  const QuantBlockArgs& q, bool first, float* acc_out, int64_t acc_stride) {
  constexpr int64_t kUnitBytes = 128;
  const char* panels[NP];
  TANDEM_UNROLL
  for (int j = 0; j < NP; ++j) panels[j] = static_cast<const char*>(panel) + j * panel_stride;
  const __m256i flip = _mm256_set1_epi8(-128);
  for (int64_t s0 = 0, seg = 0; s0 < kc; s0 += q.segment, ++seg) {
    const int64_t group = seg * q.group_step;
    const int64_t s1 = std::min(kc, s0 + q.segment);
    const bool store = first && s0 == 0;
    for (int h = 0; h < 2; ++h) {
      __m256i zero[NP];
      __m256 facc[MR][NP];
      StartHalf<kZero, kStream, MR, NP>(q, group, h, zero, facc);
      for (int64_t b0 = s0, b = s0 / x.sub; b0 < s1; b0 += x.sub, ++b) {
        const int64_t b1 = std::min(s1, b0 + x.sub);
        __m256i low[MR][NP], high[MR][NP];  // rows 0-3 and 4-7 of the pass
        TANDEM_UNROLL
        for (int i = 0; i < MR; ++i) TANDEM_UNROLL
        for (int j = 0; j < NP; ++j) low[i][j] = high[i][j] = _mm256_setzero_si256();
#pragma GCC unroll 2
        for (int64_t k = b0; k < b1; k += kUnit) {
          if (kStream && h == 0) {
            TANDEM_UNROLL
            for (int j = 0; j < NP; ++j) {
              _mm_prefetch(panels[j] + k * kUnitBytes / kUnit + q.ahead, _MM_HINT_T0);
              _mm_prefetch(panels[j] + k * kUnitBytes / kUnit + q.ahead + 64, _MM_HINT_T0);
            }
          }
          const auto* xq = reinterpret_cast<const __m256i*>(x.quads + k / kUnit * kMr * 8);
          TANDEM_UNROLL
          for (int j = 0; j < NP; ++j) {
            const auto* unit = reinterpret_cast<const __m256i*>(panels[j] + k * kUnitBytes / kUnit);
            const __m256i c01 = _mm256_loadu_si256(unit), c23 = _mm256_loadu_si256(unit + 1);
            const __m256i c45 = _mm256_loadu_si256(unit + 2), c67 = _mm256_loadu_si256(unit + 3);
            __m256i p = h == 0 ? _mm256_unpacklo_epi8(c01, c23) : _mm256_unpackhi_epi8(c01, c23);
            __m256i r = h == 0 ? _mm256_unpacklo_epi8(c45, c67) : _mm256_unpackhi_epi8(c45, c67);
            // vpdpbusd takes the codes, the sign trick the codes less 128 (symmetric codes are
            // stored that way).
            if constexpr (kZero != kVnni) {
              p = _mm256_xor_si256(p, flip);
              r = _mm256_xor_si256(r, flip);
            }
            const __m256i q0 = _mm256_unpacklo_epi16(p, r), q1 = _mm256_unpackhi_epi16(p, r);
            TANDEM_UNROLL
            for (int i = 0; i < MR; ++i) {
              const __m256i xi = _mm256_load_si256(xq + i);
              if constexpr (kVnni) {
                low[i][j] = DotQuads(low[i][j], q0, xi);
                high[i][j] = DotQuads(high[i][j], q1, xi);
              } else {
                low[i][j] = DotQuadsSigned(low[i][j], q0, xi);
                high[i][j] = DotQuadsSigned(high[i][j], q1, xi);
              }
            }
          }
        }
        TANDEM_UNROLL
        for (int i = 0; i < MR; ++i) {
          const int32_t sum = x.sums[b * kMr + i];
          const __m256 scale = _mm256_set1_ps(x.scales[b * kMr + i]);
          TANDEM_UNROLL
          for (int j = 0; j < NP; ++j) {
            __m256i t = _mm256_add_epi32(_mm256_permute2x128_si256(low[i][j], high[i][j], 0x20),
                                         _mm256_permute2x128_si256(low[i][j], high[i][j], 0x31));
            if constexpr (!kVnni) t = _mm256_add_epi32(t, _mm256_set1_epi32(128 * sum));
            facc[i][j] = AddScaledSum<kZero>(facc[i][j], t, zero[j], sum, 128, scale);
          }
        }
      }
      FinishHalf<MR, NP>(q, group, h, store, facc, acc_out, acc_stride);
    }
  }
}

// Avx2Int8Rows for one row of x (batch-1 decode), as Avx2RowKernel for 4-bit codes: both halves
// of each unit in one pass, so a unit's two lines are used whole as they arrive and x's codes
// are loaded once. Its 8 integer sums take two panels at a time (P <= 2); the same sums in the
// same order as the two passes, so the same bits. On Zen 3, 1.14x the two passes' rate with one
// group per row; groups of 32 columns measured the same (docs/benchmarks.md).
template <bool kZero, bool kStream, bool kVnni, int P>
void Avx2Int8RowPair(const IntX& x, const char* panel, int64_t panel_stride, int64_t kc,
                     const QuantBlockArgs& q, bool first, float* acc_out, int64_t acc_stride) {
  const char* src[P];
  TANDEM_UNROLL
  for (int j = 0; j < P; ++j) src[j] = panel + j * panel_stride;
  const __m256i flip = _mm256_set1_epi8(-128);
  const auto* xq = reinterpret_cast<const __m256i*>(x.quads);
  for (int64_t s0 = 0, seg = 0; s0 < kc; s0 += q.segment, ++seg) {
    const int64_t group = seg * q.group_step;
    const int64_t s1 = std::min(kc, s0 + q.segment);
    const bool store = first && s0 == 0;
    __m256i zero[2][P];
    __m256 facc[2][1][P];
    StartHalf<kZero, kStream, 1, P>(q, group, 0, zero[0], facc[0]);
    StartHalf<kZero, false, 1, P>(q, group, 1, zero[1], facc[1]);
    for (int64_t b0 = s0, b = s0 / x.sub; b0 < s1; b0 += x.sub, ++b) {
      const int64_t b1 = std::min(s1, b0 + x.sub);
      __m256i low[2][P], high[2][P];
      TANDEM_UNROLL
      for (int h = 0; h < 2; ++h) TANDEM_UNROLL
      for (int j = 0; j < P; ++j) low[h][j] = high[h][j] = _mm256_setzero_si256();
#pragma GCC unroll 2
      for (int64_t k = b0; k < b1; k += kUnit, xq += kMr) {
        const __m256i xi = _mm256_load_si256(xq);
        TANDEM_UNROLL
        for (int j = 0; j < P; ++j) {
          if constexpr (kStream) {
            _mm_prefetch(src[j] + q.ahead, _MM_HINT_T0);
            _mm_prefetch(src[j] + q.ahead + 64, _MM_HINT_T0);
          }
          const auto* unit = reinterpret_cast<const __m256i*>(src[j]);
          const __m256i c01 = _mm256_loadu_si256(unit), c23 = _mm256_loadu_si256(unit + 1);
          const __m256i c45 = _mm256_loadu_si256(unit + 2), c67 = _mm256_loadu_si256(unit + 3);
          src[j] += 128;
          TANDEM_UNROLL
          for (int h = 0; h < 2; ++h) {
            __m256i p = h == 0 ? _mm256_unpacklo_epi8(c01, c23) : _mm256_unpackhi_epi8(c01, c23);
            __m256i r = h == 0 ? _mm256_unpacklo_epi8(c45, c67) : _mm256_unpackhi_epi8(c45, c67);
            if constexpr (kZero != kVnni) {
              p = _mm256_xor_si256(p, flip);
              r = _mm256_xor_si256(r, flip);
            }
            const __m256i q0 = _mm256_unpacklo_epi16(p, r), q1 = _mm256_unpackhi_epi16(p, r);
            if constexpr (kVnni) {
              low[h][j] = DotQuads(low[h][j], q0, xi);
              high[h][j] = DotQuads(high[h][j], q1, xi);
            } else {
              low[h][j] = DotQuadsSigned(low[h][j], q0, xi);
              high[h][j] = DotQuadsSigned(high[h][j], q1, xi);
            }
          }
        }
      }
      const int32_t sum = x.sums[b * kMr];
      const __m256 scale = _mm256_set1_ps(x.scales[b * kMr]);
      TANDEM_UNROLL
      for (int h = 0; h < 2; ++h) {
        TANDEM_UNROLL
        for (int j = 0; j < P; ++j) {
          __m256i t = _mm256_add_epi32(_mm256_permute2x128_si256(low[h][j], high[h][j], 0x20),
                                       _mm256_permute2x128_si256(low[h][j], high[h][j], 0x31));
          if constexpr (!kVnni) t = _mm256_add_epi32(t, _mm256_set1_epi32(128 * sum));
          facc[h][0][j] = AddScaledSum<kZero>(facc[h][0][j], t, zero[h][j], sum, 128, scale);
        }
      }
    }
    FinishHalf<1, P>(q, group, 0, store, facc[0], acc_out, acc_stride);
    FinishHalf<1, P>(q, group, 1, store, facc[1], acc_out, acc_stride);
  }
}

template <bool kZero, bool kStream, bool kVnni, int MR, int NP>
void Avx2Int8MicroKernel(const IntX& x, const void* panel, int64_t panel_stride, int64_t kc,
                         const QuantBlockArgs& q, bool first, float* acc_out, int64_t acc_stride) {
  // 4 rows keep their sums in registers; 5 and 6 run as 4 + 1 and 4 + 2 (3 + 2 and 3 + 3
  // measured no faster, with vpdpbusd or the sign trick).
  if constexpr (MR == 1) {
    constexpr int kP = NP < 2 ? NP : 2;
    static_assert(NP % kP == 0);
    TANDEM_UNROLL
    for (int jp = 0; jp < NP; jp += kP) {
      Avx2Int8RowPair<kZero, kStream, kVnni, kP>(
          x, static_cast<const char*>(panel) + jp * panel_stride, panel_stride, kc, q.Panel(jp),
          first, acc_out + jp * kNr, acc_stride);
    }
    return;
  }
  constexpr int kRows = MR <= 4 ? MR : 4;
  Avx2Int8Rows<kZero, kStream, kVnni, kRows, NP>(x, panel, panel_stride, kc, q, first, acc_out,
                                                 acc_stride);
  if constexpr (kRows < MR) {
    const IntX rest{x.q + kRows * kUnit, x.sums + kRows, x.scales + kRows, x.sub,
                    x.quads + kRows * 8};
    Avx2Int8Rows<kZero, false, kVnni, MR - kRows, NP>(rest, panel, panel_stride, kc, q, first,
                                                      acc_out + kRows * acc_stride, acc_stride);
  }
}

using IntKernelFn = void (*)(const IntX&, const void*, int64_t, int64_t, const QuantBlockArgs&,
                             bool, float*, int64_t);

struct IntKernel {
  IntKernelFn fn;
  int panels;
};

enum class Isa { kAvx2, kAvxVnni, kAvx512Vnni };

template <Isa kIsa, int kBits, bool kZero, bool kStream, int MR, int NP>
constexpr IntKernelFn IntKernelOf() {
  if constexpr (kIsa != Isa::kAvx512Vnni) {
    constexpr bool kVnni = kIsa == Isa::kAvxVnni;
    if constexpr (kBits == 4) {
      return &Avx2MicroKernel<kZero, kStream, kVnni, MR, NP>;
    } else {
      return &Avx2Int8MicroKernel<kZero, kStream, kVnni, MR, NP>;
    }
  } else {
    return &VnniMicroKernel<kBits, kZero, kStream, MR, NP>;
  }
}

template <Isa kIsa, int kBits, bool kZero, bool kStream, bool kWide, int... I>
constexpr std::array<IntKernel, sizeof...(I)> MakeIntKernels(std::integer_sequence<int, I...>) {
  return {IntKernel{IntKernelOf < kIsa, kBits, kZero, kStream, I + 1,
                    kWide ? StreamPanels(I + 1) : 1 > (), kWide ? StreamPanels(I + 1) : 1}...};
}
// Indexed by MR - 1, as kQuantKernels.
template <Isa kIsa, int kBits, bool kZero, bool kStream = false, bool kWide = false>
constexpr auto kIntKernels =
    MakeIntKernels<kIsa, kBits, kZero, kStream, kWide>(std::make_integer_sequence<int, kMr>());

bool VnniAvailable() {
  __builtin_cpu_init();  // this may run before the runtime's own initialization
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vbmi");
}

// AVX-VNNI: CPUID leaf 7, sub-leaf 1, EAX bit 4 (clang's __builtin_cpu_supports lacks it).
bool AvxVnniAvailable() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) && (eax >> 4 & 1) != 0;
}

std::atomic<bool> use_vnni{VnniAvailable()};
std::atomic<bool> use_avx2{true};  // the build requires AVX2
std::atomic<bool> use_avx_vnni{AvxVnniAvailable()};

// Block() for the integer kernels: every M streams the codes through them (there is nothing to
// convert), decode with wide kernels and prefetch ahead, prefill with the next K block
// prefetched as in QuantBlock.
template <Isa kIsa, int kBits, bool kZero>
void IntBlock(const PackedX& x, const RowGroups& groups, int64_t g0, int64_t g1,
              const WeightMatrix& w, int64_t n0, int64_t n1, const float* bias, float* y,
              int64_t y_stride) {
  constexpr int64_t kStreamMaxGroups = 2;
  const bool stream = g1 - g0 <= kStreamMaxGroups;
  const IntKernel* narrow = stream ? kIntKernels<kIsa, kBits, kZero, true>.data()
                                   : kIntKernels<kIsa, kBits, kZero>.data();
  const IntKernel* kernels = stream ? kIntKernels<kIsa, kBits, kZero, true, true>.data() : narrow;
  float* acc = AccumulatorTile(g1 - g0);
  const int panels = static_cast<int>((n1 - n0 + kNr - 1) / kNr);
  const QuantPanelLayout layout = QuantPanelLayout::Of(w.quant, w.cols);
  const char* block_panels = static_cast<const char*>(w.data) + (n0 / kNr) * layout.panel_bytes;
  // Decode reads each panel once, front to back, and its K blocks need no joints: one call runs
  // all of them but the last, whose prefetches run on into the next block. The sums and their
  // order are those of one call per K block (a segment never spans two K blocks).
  const int64_t last = (w.cols - 1) / kKc * kKc;
  for (int64_t k0 = 0, k1; k0 < w.cols; k0 = k1) {
    k1 = stream && k0 < last ? last : std::min(w.cols, k0 + kKc);
    const int64_t kc = k1 - k0;
    QuantBlockArgs q = BlockArgs(w, block_panels, k0);
    const char* panel = block_panels + k0 * kNr * kBits / 8;
    // The last K block's prefetches run on into the next block's panels, which this thread
    // is likely to take next (ParallelForDynamic hands out runs of blocks): with 4-bit codes
    // a K block is exactly `ahead` bytes of each panel, so every one of them would otherwise
    // fall past the codes, and the next block would start on demand misses.
    if (stream && k1 == w.cols && n1 < w.rows && kc * kNr * kBits / 8 <= q.ahead) {
      q.ahead += kNb / kNr * layout.panel_bytes - w.cols * kNr * kBits / 8;
    }
    const bool first = k0 == 0;
    const int64_t next = k1, calls = (g1 - g0) * panels;
    Prefetcher prefetch;
    if (next < w.cols && !stream) {
      const int64_t next_kc = std::min(kKc, w.cols - next);
      prefetch = Prefetcher(block_panels + next * kNr * kBits / 8, layout.panel_bytes, panels,
                            next_kc * kNr * kBits / 8, calls);
    }
    int64_t call = 0;
    for (int64_t g = g0; g < g1; ++g) {
      const int mr = groups.Size(g);
      const int64_t sub = (g * x.subs + k0 / x.sub) * kMr;
      const int64_t unit = g * x.units + k0 / kUnit;
      const IntX xg{x.q + unit * kMr * kUnit, x.sums + sub, x.scales + sub, x.sub,
                    x.quads != nullptr ? x.quads + unit * kMr * 8 : nullptr};
      float* acc_g = acc + (g - g0) * kMr * kNb;
      for (int p = 0; p < panels;) {
        prefetch.UpTo(++call);
        const IntKernel kernel =
            p + kernels[mr - 1].panels <= panels ? kernels[mr - 1] : narrow[mr - 1];
        kernel.fn(xg, panel + p * layout.panel_bytes, layout.panel_bytes, kc, q.Panel(p), first,
                  acc_g + p * kNr, kNb);
        p += kernel.panels;
      }
    }
  }
  WriteTile(acc, groups, g0, g1, n0, n1, bias, y, y_stride);
}

// The sum of n int8 codes.
inline int32_t SumCodes(const int8_t* codes, int64_t n) {
  // Biased to unsigned (code + 128), psadbw adds 8 bytes at a time.
  const __m256i bias = _mm256_set1_epi8(-128);
  __m256i wide = _mm256_setzero_si256();
  int64_t j = 0;
  for (; j + 32 <= n; j += 32) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + j));
    wide =
        _mm256_add_epi64(wide, _mm256_sad_epu8(_mm256_xor_si256(v, bias), _mm256_setzero_si256()));
  }
  alignas(32) int64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), wide);
  int64_t sum = lanes[0] + lanes[1] + lanes[2] + lanes[3] - 128 * j;
  for (; j < n; ++j) sum += codes[j];
  return static_cast<int32_t>(sum);
}

// One row of x: its codes at q + i * 8 of each unit's kMr * 8 bytes, its sums and scales at
// [sub-block * kMr + i].
void PackRow(const float* src, int64_t k, const int32_t* order, int64_t block, int64_t sub,
             int8_t* q, int32_t* sums, float* scales) {
  thread_local std::vector<float> row;
  thread_local std::vector<int8_t> codes;
  const int64_t units = (k + kUnit - 1) / kUnit, subs = (k + sub - 1) / sub;
  // Two units' worth of slack: the reordering below reads 16 codes at a time.
  if (static_cast<int64_t>(codes.size()) < (units + 2) * kUnit) codes.resize((units + 2) * kUnit);
  if (order != nullptr) {
    if (static_cast<int64_t>(row.size()) < k) row.resize(k);
    for (int64_t j = 0; j < k; ++j) row[j] = src[order[j]];
    src = row.data();
  }
  if (block == 0) block = k;
  for (int64_t b = 0; b < subs; ++b) {
    const int64_t b0 = b * sub, b1 = std::min(k, b0 + sub);
    // A sub-block lies within one activation block, quantized at its first sub-block.
    if (b0 % block == 0) {
      const float scale = RoundToInt8(src + b0, std::min(block, k - b0), codes.data() + b0);
      for (int64_t s = b; s < subs && s * sub < b0 + block; ++s) scales[s * kMr] = scale;
    }
    sums[b * kMr] = SumCodes(codes.data() + b0, b1 - b0);
  }
  std::fill(codes.begin() + k, codes.end(), 0);
  // Each unit's codes even columns first (XPosition), two units per shuffle.
  const __m128i even_first = _mm_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15);
  static_assert(XPosition(1) == 4 && XPosition(2) == 1 && XPosition(7) == 7);
  for (int64_t u = 0; u < units; u += 2) {
    const __m128i v = _mm_shuffle_epi8(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes.data() + u * kUnit)), even_first);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(q + u * kMr * kUnit), v);
    if (u + 1 < units) {
      _mm_storel_epi64(reinterpret_cast<__m128i*>(q + (u + 1) * kMr * kUnit),
                       _mm_unpackhi_epi64(v, v));
    }
  }
}

}  // namespace

int64_t IntSubBlock(const WeightMatrix& w) {
  if (!use_vnni.load(std::memory_order_relaxed)) {
    if (!use_avx2.load(std::memory_order_relaxed)) return 0;
  }
  const int64_t group = w.quant.group_size > 0 ? w.quant.group_size : w.cols;
  const int64_t sub = group == w.cols ? 32 : std::min<int64_t>(32, group);
  if (sub % kUnit != 0) return 0;
  if (w.quant.activation_block > 0 && w.quant.activation_block % sub != 0) return 0;
  return sub;
}

bool IntWantsQuads(const WeightMatrix& w) {
  return w.quant.bits == 8 && !use_vnni.load(std::memory_order_relaxed);
}

template <Isa kIsa>
BlockFn IntBlockOf(bool bits8, bool zero) {
  if (bits8) return zero ? &IntBlock<kIsa, 8, true> : &IntBlock<kIsa, 8, false>;
  return zero ? &IntBlock<kIsa, 4, true> : &IntBlock<kIsa, 4, false>;
}

BlockFn IntBlockFor(const WeightMatrix& w) {
  const bool zero = w.quant.has_zero;
  const bool bits8 = w.quant.bits == 8;
  if (use_vnni.load(std::memory_order_relaxed)) return IntBlockOf<Isa::kAvx512Vnni>(bits8, zero);
  if (use_avx_vnni.load(std::memory_order_relaxed)) return IntBlockOf<Isa::kAvxVnni>(bits8, zero);
  return IntBlockOf<Isa::kAvx2>(bits8, zero);
}

std::string IntKernelIsa(const WeightMatrix& w) {
  if (use_vnni.load(std::memory_order_relaxed)) return "AVX512-VNNI vpdpbusd";
  if (use_avx_vnni.load(std::memory_order_relaxed)) return "AVX-VNNI vpdpbusd";
  return w.quant.bits == 8 ? "AVX2 vpmaddubsw, sign trick" : "AVX2 vpmaddubsw";
}

PackedX PackXInt8(const float* x, int64_t x_stride, int64_t k, const RowGroups& groups,
                  const int32_t* order, int64_t block, int64_t sub, bool quads, ThreadPool& pool) {
  thread_local std::vector<int8_t> q;
  thread_local std::vector<int32_t> quad;  // PackedX::quads
  thread_local std::vector<int32_t> sums;
  thread_local std::vector<float> scales;
  PackedX p{.units = (k + kUnit - 1) / kUnit, .subs = (k + sub - 1) / sub, .sub = sub};
  const int64_t q_bytes = groups.count * p.units * kMr * kUnit;
  const int64_t sub_entries = groups.count * p.subs * kMr;
  if (static_cast<int64_t>(q.size()) < q_bytes) q.resize(q_bytes);
  if (static_cast<int64_t>(sums.size()) < sub_entries) sums.resize(sub_entries);
  if (static_cast<int64_t>(scales.size()) < sub_entries) scales.resize(sub_entries);
  // 32-byte aligned: 8 more entries than the vectors.
  const int64_t quad_entries = quads ? groups.count * p.units * kMr * 8 + 8 : 0;
  if (static_cast<int64_t>(quad.size()) < quad_entries) quad.resize(quad_entries);
  auto* quad_data =
      reinterpret_cast<int32_t*>((reinterpret_cast<uintptr_t>(quad.data()) + 31) & ~uintptr_t{31});
  int8_t* q_data = q.data();
  int32_t* sums_data = sums.data();
  float* scales_data = scales.data();
  // A group of r rows runs the kernels for r rows, which read no other slot: the unused ones
  // are left as they are.
  auto pack = [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
      for (int i = 0; i < groups.Size(g); ++i) {
        const int64_t at = g * p.subs * kMr + i;
        PackRow(x + (groups.Start(g) + i) * x_stride, k, order, block, sub,
                q_data + g * p.units * kMr * kUnit + i * kUnit, sums_data + at, scales_data + at);
      }
      if (!quads) continue;
      // A unit's codes x0 x2 x4 x6 | x1 x3 x5 x7 to each half of a vector.
      for (int64_t unit = g * p.units; unit < (g + 1) * p.units; ++unit) {
        for (int64_t u = unit * kMr; u < unit * kMr + groups.Size(g); ++u) {
          int32_t even, odd;
          std::memcpy(&even, q_data + u * kUnit, 4);
          std::memcpy(&odd, q_data + u * kUnit + 4, 4);
          std::fill_n(quad_data + u * 8, 4, even);
          std::fill_n(quad_data + u * 8 + 4, 4, odd);
        }
      }
    }
  };
  // A decode step's few rows are not worth waking the pool for.
  constexpr int64_t kGrain = 8;
  if (groups.count <= kGrain) {
    pack(0, groups.count);
  } else {
    pool.ParallelFor(groups.count, kGrain, pack);
  }
  p.q = q_data;
  p.sums = sums_data;
  p.scales = scales_data;
  if (quads) p.quads = quad_data;
  return p;
}

}  // namespace tiled

bool UseVnniQuantKernels(bool use) {
  tiled::use_vnni.store(use && tiled::VnniAvailable());
  return use && tiled::VnniAvailable();
}

bool UseAvx2IntegerQuantKernels(bool use) {
  tiled::use_avx2.store(use);
  return use && !tiled::use_vnni.load();
}

bool UseAvxVnniIntegerQuantKernels(bool use) {
  tiled::use_avx_vnni.store(use && tiled::AvxVnniAvailable());
  return use && tiled::AvxVnniAvailable();
}

}  // namespace tandem::kernels::internal
