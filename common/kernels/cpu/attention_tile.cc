#include "common/kernels/cpu/attention_tile.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/kernels/cpu/simd_util.h"

namespace tandem::kernels::internal {
namespace {

constexpr int kLd = kKeyChunk;  // row stride of the score/probability tile
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// p[r][j] = q_r . k_j for RR rows and keys [0, nkeys rounded up to 4). Four keys at a time
// share each q load and reduce together with HorizontalSum4.
template <int RR>
void Scores(const float* q, int dp, const float* k, int nkeys, float* p) {
  for (int j = 0; j < nkeys; j += 4) {
    __m256 acc[RR][4];
    TANDEM_UNROLL
    for (int r = 0; r < RR; ++r) TANDEM_UNROLL
    for (int c = 0; c < 4; ++c) acc[r][c] = _mm256_setzero_ps();
    const float* kj = k + static_cast<int64_t>(j) * dp;
    for (int d = 0; d < dp; d += 8) {
      __m256 kv[4];
      TANDEM_UNROLL
      for (int c = 0; c < 4; ++c) kv[c] = _mm256_loadu_ps(kj + c * dp + d);
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
template <int RR, int NV>
void AccumulatePv(const float* p, const float* v, int dp, int d0, int nkeys, const float* alpha,
                  float* o) {
  __m256 acc[RR][NV];
  TANDEM_UNROLL
  for (int r = 0; r < RR; ++r) {
    const __m256 a = _mm256_set1_ps(alpha[r]);
    TANDEM_UNROLL
    for (int c = 0; c < NV; ++c)
      acc[r][c] = _mm256_mul_ps(_mm256_loadu_ps(o + r * dp + d0 + 8 * c), a);
  }
  for (int j = 0; j < nkeys; ++j) {
    __m256 vv[NV];
    TANDEM_UNROLL
    for (int c = 0; c < NV; ++c)
      vv[c] = _mm256_loadu_ps(v + static_cast<int64_t>(j) * dp + d0 + 8 * c);
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

template <int RR>
void AccumulatePvRows(const float* p, const float* v, int dp, int nkeys, const float* alpha,
                      float* o) {
  int d0 = 0;
  for (; d0 + 32 <= dp; d0 += 32) AccumulatePv<RR, 4>(p, v, dp, d0, nkeys, alpha, o);
  switch ((dp - d0) / 8) {
    case 3:
      return AccumulatePv<RR, 3>(p, v, dp, d0, nkeys, alpha, o);
    case 2:
      return AccumulatePv<RR, 2>(p, v, dp, d0, nkeys, alpha, o);
    case 1:
      return AccumulatePv<RR, 1>(p, v, dp, d0, nkeys, alpha, o);
  }
}

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

void AttentionScratch::Reset(int rows, int dp) {
  const size_t rd = static_cast<size_t>(rows) * dp;
  if (q.size() < rd) q.resize(rd);
  o.assign(rd, 0.0f);
  if (k.size() < static_cast<size_t>(kKeyChunk) * dp) {
    k.assign(static_cast<size_t>(kKeyChunk) * dp, 0.0f);
    v.assign(static_cast<size_t>(kKeyChunk) * dp, 0.0f);
  }
  if (p.size() < static_cast<size_t>(rows) * kLd) p.resize(static_cast<size_t>(rows) * kLd);
  max.assign(rows, kNegInf);
  sum.assign(rows, 0.0f);
  alpha.resize(rows);
  row_pos.resize(rows);
}

void AttendChunk(AttentionScratch& s, int rows, int dp, int64_t c0, int n) {
  // Rows are ordered by position, so those that see none of this chunk form a prefix.
  int r0 = 0;
  while (r0 < rows && s.row_pos[r0] < c0) ++r0;
  auto valid = [&](int r) { return static_cast<int>(std::min<int64_t>(n, s.row_pos[r] - c0 + 1)); };
  auto row = [dp](std::vector<float>& buf, int r) {
    return buf.data() + static_cast<int64_t>(r) * dp;
  };
  float* p = s.p.data();
  int r = r0;
  for (; r + 2 <= rows; r += 2) Scores<2>(row(s.q, r), dp, s.k.data(), valid(r + 1), p + r * kLd);
  if (r < rows) Scores<1>(row(s.q, r), dp, s.k.data(), valid(r), p + r * kLd);
  for (r = r0; r < rows; ++r) {
    s.alpha[r] = SoftmaxStep(p + r * kLd, valid(r), n, s.max[r], s.sum[r]);
  }
  for (r = r0; r + 2 <= rows; r += 2) {
    AccumulatePvRows<2>(p + r * kLd, s.v.data(), dp, valid(r + 1), s.alpha.data() + r, row(s.o, r));
  }
  if (r < rows)
    AccumulatePvRows<1>(p + r * kLd, s.v.data(), dp, valid(r), s.alpha.data() + r, row(s.o, r));
}

}  // namespace tandem::kernels::internal
