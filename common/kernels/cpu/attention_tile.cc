#include "common/kernels/cpu/attention_tile.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>

#include "common/kernels/cpu/simd_avx512.h"
#include "common/kernels/cpu/simd_util.h"

namespace tandem::kernels::internal {
namespace {

constexpr int kLd = kKeyChunk;  // row stride of the score/probability tile
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Loads of a chunk's rows as f32 vectors: 8 or 16 elements from p. The bf16 and fp16 loads
// widen exactly, so every row type gives the f32 kernels the same values.
struct LoadF32 {
  using T = float;
  static __m256 Load8(const T* p) { return _mm256_loadu_ps(p); }
};
struct LoadBf16 {
  using T = uint16_t;
  static __m256 Load8(const T* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
};
struct LoadF16 {
  using T = uint16_t;
  static __m256 Load8(const T* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
};

template <typename L>
const typename L::T* RowAt(const void* const* rows, int j) {
  return static_cast<const typename L::T*>(rows[j]);
}

// p[r][j] = q_r . k_j for RR rows and keys [0, nkeys rounded up to 4). Four keys at a time
// share each q load and reduce together with HorizontalSum4.
template <typename L, int RR>
void Scores(const float* q, int dp, const void* const* k, int nkeys, float* p) {
  for (int j = 0; j < nkeys; j += 4) {
    __m256 acc[RR][4];
    TANDEM_UNROLL
    for (int r = 0; r < RR; ++r) TANDEM_UNROLL
    for (int c = 0; c < 4; ++c) acc[r][c] = _mm256_setzero_ps();
    const typename L::T* kj[4];
    TANDEM_UNROLL
    for (int c = 0; c < 4; ++c) kj[c] = RowAt<L>(k, j + c);
    for (int d = 0; d < dp; d += 8) {
      __m256 kv[4];
      TANDEM_UNROLL
      for (int c = 0; c < 4; ++c) kv[c] = L::Load8(kj[c] + d);
      TANDEM_UNROLL
      for (int r = 0; r < RR; ++r) {
        __m256 qv = _mm256_loadu_ps(q + r * dp + d);
        TANDEM_UNROLL
        for (int c = 0; c < 4; ++c) acc[r][c] = _mm256_fmadd_ps(qv, kv[c], acc[r][c]);
      }
    }
    TANDEM_UNROLL
    for (int r = 0; r < RR; ++r) {
      _mm_storeu_ps(p + r * kLd + j,
                    simd::HorizontalSum4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]));
    }
  }
}

// o_r = o_r * alpha_r + sum_j p[r][j] * v_j over dims [d0, d0 + 8 * NV), for RR rows.
template <typename L, int RR, int NV>
void AccumulatePv(const float* p, const void* const* v, int dp, int d0, int nkeys,
                  const float* alpha, float* o) {
  __m256 acc[RR][NV];
  TANDEM_UNROLL
  for (int r = 0; r < RR; ++r) {
    const __m256 a = _mm256_set1_ps(alpha[r]);
    TANDEM_UNROLL
    for (int c = 0; c < NV; ++c)
      acc[r][c] = _mm256_mul_ps(_mm256_loadu_ps(o + r * dp + d0 + 8 * c), a);
  }
  for (int j = 0; j < nkeys; ++j) {
    const typename L::T* vj = RowAt<L>(v, j) + d0;
    __m256 vv[NV];
    TANDEM_UNROLL
    for (int c = 0; c < NV; ++c) vv[c] = L::Load8(vj + 8 * c);
    TANDEM_UNROLL
    for (int r = 0; r < RR; ++r) {
      const __m256 pj = _mm256_broadcast_ss(p + r * kLd + j);
      TANDEM_UNROLL
      for (int c = 0; c < NV; ++c) acc[r][c] = _mm256_fmadd_ps(pj, vv[c], acc[r][c]);
    }
  }
  TANDEM_UNROLL
  for (int r = 0; r < RR; ++r) TANDEM_UNROLL
  for (int c = 0; c < NV; ++c) _mm256_storeu_ps(o + r * dp + d0 + 8 * c, acc[r][c]);
}

template <typename L, int RR>
void AccumulatePvRows(const float* p, const void* const* v, int dp, int nkeys, const float* alpha,
                      float* o) {
  int d0 = 0;
  for (; d0 + 32 <= dp; d0 += 32) AccumulatePv<L, RR, 4>(p, v, dp, d0, nkeys, alpha, o);
  switch ((dp - d0) / 8) {
    case 3:
      return AccumulatePv<L, RR, 3>(p, v, dp, d0, nkeys, alpha, o);
    case 2:
      return AccumulatePv<L, RR, 2>(p, v, dp, d0, nkeys, alpha, o);
    case 1:
      return AccumulatePv<L, RR, 1>(p, v, dp, d0, nkeys, alpha, o);
  }
}

// The same two loops on AVX-512 where the CPU has it, four rows at a time (32 registers hold
// the bigger tiles). Each lane runs the AVX2 loops' operations in the same order, so results
// are bit-identical: Scores512 puts two keys in one zmm (dims d..d+7 of key c in the low half,
// of key c+1 in the high half), so every lane sums the same products in the same order and the
// halves reduce exactly as HorizontalSum4 does; AccumulatePv512 is elementwise over dims.
#if !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

// Load8's 16-lane forms, picked by the loader's type.
TANDEM_AVX512 inline __m512 Load16(LoadF32, const float* p) { return _mm512_loadu_ps(p); }
TANDEM_AVX512 inline __m512 Load16(LoadBf16, const uint16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
TANDEM_AVX512 inline __m512 Load16(LoadF16, const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

template <typename L, int RR>
TANDEM_AVX512 void Scores512(const float* q, int dp, const void* const* k, int nkeys, float* p) {
  for (int j = 0; j < nkeys; j += 4) {
    __m512 acc[RR][2];  // [row][key pair]: keys j, j+1 and j+2, j+3
    TANDEM_UNROLL
    for (int r = 0; r < RR; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    const typename L::T* kj[4];
    TANDEM_UNROLL
    for (int c = 0; c < 4; ++c) kj[c] = RowAt<L>(k, j + c);
    for (int d = 0; d < dp; d += 8) {
      __m512 kv[2];
      TANDEM_UNROLL
      for (int c = 0; c < 2; ++c) {
        kv[c] = _mm512_insertf32x8(_mm512_castps256_ps512(L::Load8(kj[2 * c] + d)),
                                   L::Load8(kj[2 * c + 1] + d), 1);
      }
      TANDEM_UNROLL
      for (int r = 0; r < RR; ++r) {
        const __m512 qv = _mm512_broadcast_f32x8(_mm256_loadu_ps(q + r * dp + d));
        TANDEM_UNROLL
        for (int c = 0; c < 2; ++c) acc[r][c] = _mm512_fmadd_ps(qv, kv[c], acc[r][c]);
      }
    }
    TANDEM_UNROLL
    for (int r = 0; r < RR; ++r) {
      _mm_storeu_ps(p + r * kLd + j, simd::HorizontalSum4(_mm512_castps512_ps256(acc[r][0]),
                                                          _mm512_extractf32x8_ps(acc[r][0], 1),
                                                          _mm512_castps512_ps256(acc[r][1]),
                                                          _mm512_extractf32x8_ps(acc[r][1], 1)));
    }
  }
}

// AccumulatePv over dims [d0, d0 + 16 * NV).
template <typename L, int RR, int NV>
TANDEM_AVX512 void AccumulatePv512(const float* p, const void* const* v, int dp, int d0, int nkeys,
                                   const float* alpha, float* o) {
  __m512 acc[RR][NV];
  TANDEM_UNROLL
  for (int r = 0; r < RR; ++r) {
    const __m512 a = _mm512_set1_ps(alpha[r]);
    TANDEM_UNROLL
    for (int c = 0; c < NV; ++c)
      acc[r][c] = _mm512_mul_ps(_mm512_loadu_ps(o + r * dp + d0 + 16 * c), a);
  }
  for (int j = 0; j < nkeys; ++j) {
    const typename L::T* vj = RowAt<L>(v, j) + d0;
    __m512 vv[NV];
    TANDEM_UNROLL
    for (int c = 0; c < NV; ++c) vv[c] = Load16(L{}, vj + 16 * c);
    TANDEM_UNROLL
    for (int r = 0; r < RR; ++r) {
      const __m512 pj = _mm512_set1_ps(p[r * kLd + j]);
      TANDEM_UNROLL
      for (int c = 0; c < NV; ++c) acc[r][c] = _mm512_fmadd_ps(pj, vv[c], acc[r][c]);
    }
  }
  TANDEM_UNROLL
  for (int r = 0; r < RR; ++r) TANDEM_UNROLL
  for (int c = 0; c < NV; ++c) _mm512_storeu_ps(o + r * dp + d0 + 16 * c, acc[r][c]);
}

template <typename L, int RR>
TANDEM_AVX512 void AccumulatePvRows512(const float* p, const void* const* v, int dp, int nkeys,
                                       const float* alpha, float* o) {
  int d0 = 0;
  for (; d0 + 64 <= dp; d0 += 64) AccumulatePv512<L, RR, 4>(p, v, dp, d0, nkeys, alpha, o);
  for (; d0 + 16 <= dp; d0 += 16) AccumulatePv512<L, RR, 1>(p, v, dp, d0, nkeys, alpha, o);
  if (d0 < dp) AccumulatePv<L, RR, 1>(p, v, dp, d0, nkeys, alpha, o);  // dp % 16 == 8
}

// SoftmaxStep with 16-lane exponentials. The maximum is exact in any order; the sum adds each
// 8-lane half in the AVX2 loop's order, so the bits match.
TANDEM_AVX512 float SoftmaxStep512(float* p, int valid, int n, float& max, float& sum) {
  const int n8 = (n + 7) & ~7;
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512 neg_inf = _mm512_set1_ps(kNegInf);
  __m512 mx = neg_inf;
  for (int j = 0; j < n8; j += 16) {
    const __mmask16 keep =
        _mm512_cmpgt_epi32_mask(_mm512_set1_epi32(std::min(valid, n8) - j), lane);
    mx = _mm512_max_ps(mx, _mm512_mask_loadu_ps(neg_inf, keep, p + j));
  }
  const float new_max = std::max(max, _mm512_reduce_max_ps(mx));
  const __m512 m = _mm512_set1_ps(new_max);
  __m256 total = _mm256_setzero_ps();
  for (int j = 0; j < n8; j += 16) {
    const __mmask16 in_row = static_cast<__mmask16>(n8 - j >= 16 ? 0xFFFF : 0x00FF);
    const __mmask16 keep = _mm512_cmpgt_epi32_mask(_mm512_set1_epi32(valid - j), lane);
    const __m512 x = _mm512_maskz_loadu_ps(in_row, p + j);
    const __m512 e = _mm512_maskz_mov_ps(keep, simd::Exp512(_mm512_sub_ps(x, m)));
    total = _mm256_add_ps(total, _mm512_castps512_ps256(e));
    if (in_row == 0xFFFF) total = _mm256_add_ps(total, _mm512_extractf32x8_ps(e, 1));
    _mm512_mask_storeu_ps(p + j, in_row, e);
  }
  const float alpha = max == kNegInf ? 0.0f : std::exp(max - new_max);
  max = new_max;
  sum = sum * alpha + simd::HorizontalSum(total);
  return alpha;
}

#if !defined(__clang__)
#pragma GCC diagnostic pop
#endif

bool Avx512Available() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512dq");
}

std::atomic<bool> use_avx512{Avx512Available()};

// Turns row scores p[0, valid) into exp(score - new max), zeroes p[valid, n rounded up to 8),
// and updates the row's running max and sum; returns the factor that rescales o.
float SoftmaxStep(float* p, int valid, int n, float& max, float& sum) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const int n8 = (n + 7) & ~7;
  __m256 mx = _mm256_set1_ps(kNegInf);
  for (int j = 0; j < n8; j += 8) {
    __m256 keep = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(valid - j), lane));
    mx = _mm256_max_ps(mx, _mm256_blendv_ps(_mm256_set1_ps(kNegInf), _mm256_loadu_ps(p + j), keep));
  }
  const float new_max = std::max(max, simd::HorizontalMax(mx));
  const __m256 m = _mm256_set1_ps(new_max);
  __m256 total = _mm256_setzero_ps();
  for (int j = 0; j < n8; j += 8) {
    __m256 keep = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(valid - j), lane));
    __m256 e = _mm256_and_ps(simd::Exp(_mm256_sub_ps(_mm256_loadu_ps(p + j), m)), keep);
    total = _mm256_add_ps(total, e);
    _mm256_storeu_ps(p + j, e);
  }
  // max is -inf before the first chunk: exp(-inf) = 0 discards the empty accumulators.
  const float alpha = max == kNegInf ? 0.0f : std::exp(max - new_max);
  max = new_max;
  sum = sum * alpha + simd::HorizontalSum(total);
  return alpha;
}

}  // namespace

void AttentionScratch::Reset(int rows, int dp, int heads) {
  const int lanes = (rows + kTileLanes - 1) / kTileLanes * kTileLanes;
  const size_t rd = static_cast<size_t>(rows) * dp;
  if (q.size() < rd) q.resize(rd);
  o.assign(static_cast<size_t>(lanes) * dp, 0.0f);
  if (k.size() < static_cast<size_t>(kKeyChunk) * dp) {
    k.assign(static_cast<size_t>(kKeyChunk) * dp, 0.0f);
    v.assign(static_cast<size_t>(kKeyChunk) * dp, 0.0f);
  }
  k_rows.resize(static_cast<size_t>(heads) * kKeyChunk);
  v_rows.resize(static_cast<size_t>(heads) * kKeyChunk);
  if (zero_row.size() < static_cast<size_t>(dp)) zero_row.assign(dp, 0.0f);
  if (p.size() < static_cast<size_t>(rows) * kLd) p.resize(static_cast<size_t>(rows) * kLd);
  max.assign(lanes, kNegInf);
  sum.assign(lanes, 0.0f);
  alpha.resize(lanes);
  row_pos.assign(lanes, -1);
}

void PointAtGatheredRows(AttentionScratch& s, int dp) {
  for (int j = 0; j < kKeyChunk; ++j) {
    s.k_rows[j] = s.k.data() + static_cast<int64_t>(j) * dp;
    s.v_rows[j] = s.v.data() + static_cast<int64_t>(j) * dp;
  }
}

namespace {

template <typename L>
void AttendChunkOf(AttentionScratch& s, int rows, int dp, int64_t c0, int n) {
  // Rows are ordered by position, so those that see none of this chunk form a prefix.
  int r0 = 0;
  while (r0 < rows && s.row_pos[r0] < c0) ++r0;
  auto valid = [&](int r) { return static_cast<int>(std::min<int64_t>(n, s.row_pos[r] - c0 + 1)); };
  auto row = [dp](std::vector<float>& buf, int r) {
    return buf.data() + static_cast<int64_t>(r) * dp;
  };
  float* p = s.p.data();
  const void* const* k = s.k_rows.data();
  const void* const* v = s.v_rows.data();
  const bool wide = use_avx512.load(std::memory_order_relaxed);
  int r = r0;
  if (wide) {
    for (; r + 8 <= rows; r += 8) Scores512<L, 8>(row(s.q, r), dp, k, valid(r + 7), p + r * kLd);
    for (; r + 4 <= rows; r += 4) Scores512<L, 4>(row(s.q, r), dp, k, valid(r + 3), p + r * kLd);
  }
  for (; r + 2 <= rows; r += 2) Scores<L, 2>(row(s.q, r), dp, k, valid(r + 1), p + r * kLd);
  if (r < rows) Scores<L, 1>(row(s.q, r), dp, k, valid(r), p + r * kLd);
  for (r = r0; r < rows; ++r) {
    s.alpha[r] = wide ? SoftmaxStep512(p + r * kLd, valid(r), n, s.max[r], s.sum[r])
                      : SoftmaxStep(p + r * kLd, valid(r), n, s.max[r], s.sum[r]);
  }
  r = r0;
  if (wide) {
    for (; r + 4 <= rows; r += 4) {
      AccumulatePvRows512<L, 4>(p + r * kLd, v, dp, valid(r + 3), s.alpha.data() + r, row(s.o, r));
    }
  }
  for (; r + 2 <= rows; r += 2) {
    AccumulatePvRows<L, 2>(p + r * kLd, v, dp, valid(r + 1), s.alpha.data() + r, row(s.o, r));
  }
  if (r < rows)
    AccumulatePvRows<L, 1>(p + r * kLd, v, dp, valid(r), s.alpha.data() + r, row(s.o, r));
}

}  // namespace

void AttendChunk(AttentionScratch& s, KvRows type, int rows, int dp, int64_t c0, int n) {
  switch (type) {
    case KvRows::kF32:
      return AttendChunkOf<LoadF32>(s, rows, dp, c0, n);
    case KvRows::kBf16:
      return AttendChunkOf<LoadBf16>(s, rows, dp, c0, n);
    case KvRows::kF16:
      return AttendChunkOf<LoadF16>(s, rows, dp, c0, n);
  }
}

bool UseAvx512Attention(bool use) {
  use_avx512.store(use && Avx512Available());
  return use && Avx512Available();
}

}  // namespace tandem::kernels::internal
