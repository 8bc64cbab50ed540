// Prefill GEMM: y = x * W^T + bias for large M, as a BLIS-style packed outer-product kernel.
//
// W ([N, K], any dtype) is packed block by block into f32 micro-panels of kNr weight rows
// stored k-major ([kc][kNr]), so the microkernel reads two vectors of weights per k and
// broadcasts one x element per row of x: 12 independent FMA chains on 6 x 16 outputs with
// 2 + 6 loads per 12 FMAs. Loops: N blocks (threads split these) > K blocks > M (6 rows) >
// micro-panels; the packed block (kNb x kKc f32, 64 KiB) and a contiguous accumulator for the
// block's outputs stay in L2 while all of M streams past, and the next K block's weights are
// prefetched meanwhile. Measured on 1B shapes with weights cold (kernels_bench BM_GemmPrefill,
// 2 threads): 105 GFLOP/s before the accumulator and the prefetch, 130-140 after.

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <utility>
#include <vector>

#include "common/kernels/cpu/gemm_internal.h"
#include "common/kernels/cpu/simd_util.h"

namespace tandem::kernels::internal {
namespace {

constexpr int kMr = 6;            // rows of x per microkernel (broadcast operand)
constexpr int kNr = 16;           // weight rows per micro-panel (two vectors; 4x24 measured equal)
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

// acc[0:MR, 0:kNr] (+)= xp^T * panel over kc steps, where xp holds kMr x values per k (packed
// x); `first` stores, else adds.
template <int MR>
void MicroKernel(const float* xp, const float* panel, int64_t kc, bool first, float* acc_out,
                 int64_t acc_stride) {
  __m256 acc[MR][kNv];
  TANDEM_UNROLL
  for (int i = 0; i < MR; ++i) TANDEM_UNROLL
  for (int v = 0; v < kNv; ++v) acc[i][v] = _mm256_setzero_ps();
#pragma GCC unroll 4
  for (int64_t k = 0; k < kc; ++k) {
    __m256 b[kNv];
    TANDEM_UNROLL
    for (int v = 0; v < kNv; ++v) b[v] = _mm256_loadu_ps(panel + k * kNr + 8 * v);
    TANDEM_UNROLL
    for (int i = 0; i < MR; ++i) {
      const __m256 a = _mm256_broadcast_ss(xp + k * kMr + i);
      TANDEM_UNROLL
      for (int v = 0; v < kNv; ++v) acc[i][v] = _mm256_fmadd_ps(a, b[v], acc[i][v]);
    }
  }
  TANDEM_UNROLL
  for (int i = 0; i < MR; ++i) {
    float* out = acc_out + i * acc_stride;
    TANDEM_UNROLL
    for (int v = 0; v < kNv; ++v) {
      const __m256 sum = first ? acc[i][v] : _mm256_add_ps(acc[i][v], _mm256_loadu_ps(out + 8 * v));
      _mm256_storeu_ps(out + 8 * v, sum);
    }
  }
}

using KernelFn = void (*)(const float*, const float*, int64_t, bool, float*, int64_t);
template <int... I>
constexpr std::array<KernelFn, sizeof...(I)> MakeKernels(std::integer_sequence<int, I...>) {
  return {&MicroKernel<I + 1>...};
}
constexpr auto kKernels = MakeKernels(std::make_integer_sequence<int, kMr>());

// Prefetches rows [n0, n1) x columns [k0, k0 + kKc) of W, the cache lines spread evenly over
// `calls` calls of UpTo(1..calls).
template <DType T>
class BlockPrefetcher {
 public:
  BlockPrefetcher(const WeightMatrix& w, int64_t n0, int64_t n1, int64_t k0, int64_t calls)
      : calls_(calls) {
    if (k0 >= w.cols) return;
    constexpr int64_t kElem = DTypeSize(T);
    row0_ = static_cast<const char*>(w.data) + (n0 * w.cols + k0) * kElem;
    row_bytes_ = w.cols * kElem;
    row_lines_ = (std::min(kKc, w.cols - k0) * kElem + 63) / 64;
    lines_ = (n1 - n0) * row_lines_;
  }

  void UpTo(int64_t call) {
    for (const int64_t end = lines_ * call / calls_; line_ < end; ++line_) {
      _mm_prefetch(row0_ + (line_ / row_lines_) * row_bytes_ + (line_ % row_lines_) * 64,
                   _MM_HINT_T0);
    }
  }

 private:
  const char* row0_ = nullptr;
  int64_t row_bytes_ = 0, row_lines_ = 1, lines_ = 0, line_ = 0;
  int64_t calls_;
};

// Thread-local so each worker packs into its own L2-resident buffer without allocating.
float* PackBuffer() {
  thread_local std::vector<float> buffer(kNb * kKc);
  return buffer.data();
}

// Packs x into groups of kMr rows stored k-major within each K block of kKc columns, the
// groups of one K block contiguous: x[kMr g + i, k0 + kk] lands at
// xp[k0 * m_pad + (g * kc + kk) * kMr + i] (m_pad: m rounded up to kMr; kc: the block's width).
// The last group is zero-padded. Unpacked, the kMr rows of a microkernel sit a multiple of
// 4 KiB apart for typical K and fight over the same L1 sets; blocked by K, the microkernels of
// one K block read x as a single sequential stream.
void PackX(const float* x, int64_t m, int64_t x_stride, int64_t k, float* xp, ThreadPool& pool) {
  const int64_t groups = (m + kMr - 1) / kMr;
  const int64_t m_pad = groups * kMr;
  pool.ParallelFor(groups, 8, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
      for (int i = 0; i < kMr; ++i) {
        const int64_t row = g * kMr + i;
        const float* src = row < m ? x + row * x_stride : nullptr;
        for (int64_t k0 = 0; k0 < k; k0 += kKc) {
          const int64_t kc = std::min(kKc, k - k0);
          float* dst = xp + k0 * m_pad + g * kc * kMr + i;
          for (int64_t kk = 0; kk < kc; ++kk) dst[kk * kMr] = src ? src[k0 + kk] : 0.0f;
        }
      }
    }
  });
}

// Computes y[m0:m1, n0:n1] for one work item; n1 - n0 <= kNb and m0 is a multiple of kMr.
// xp is x packed by PackX for m_pad rows. The sums build up over the K blocks in a contiguous
// thread-local tile ([m][kNb]) and are written to y once at the end: y's own rows lie N floats
// apart, a power of two for most models, so the rows of a tile would share cache sets and be
// refetched from L3 on every K block (measured: 20% of the GEMM's time).
template <DType T>
void Block(const float* xp, int64_t m_pad, int64_t m0, int64_t m1, const WeightMatrix& w,
           int64_t n0, int64_t n1, const float* bias, float* y, int64_t y_stride) {
  float* packed = PackBuffer();
  thread_local std::vector<float> acc_buffer;
  const int64_t rows = (m1 - m0 + kMr - 1) / kMr * kMr;
  if (static_cast<int64_t>(acc_buffer.size()) < rows * kNb) acc_buffer.resize(rows * kNb);
  float* acc = acc_buffer.data();
  const int panels = static_cast<int>((n1 - n0 + kNr - 1) / kNr);
  for (int64_t k0 = 0; k0 < w.cols; k0 += kKc) {
    const int64_t kc = std::min(kKc, w.cols - k0);
    for (int p = 0; p < panels; ++p) {
      const int nr = static_cast<int>(std::min<int64_t>(kNr, n1 - n0 - p * kNr));
      PackMicroPanel<T>(w, n0 + p * kNr, nr, k0, kc, packed + p * kKc * kNr);
    }
    const bool first = k0 == 0;
    // The next K block's weights are prefetched while this one computes, spread evenly over
    // the microkernel calls: packing otherwise waits on DRAM latency row by row, and a model's
    // weights are never in cache.
    BlockPrefetcher<T> prefetch(w, n0, n1, k0 + kc, rows / kMr * panels);
    int64_t call = 0;
    for (int64_t m = m0; m < m1; m += kMr) {
      const int mr = static_cast<int>(std::min<int64_t>(kMr, m1 - m));
      for (int p = 0; p < panels; ++p) {
        prefetch.UpTo(++call);
        kKernels[mr - 1](xp + (k0 * m_pad + m * kc), packed + p * kKc * kNr, kc, first,
                         acc + (m - m0) * kNb + p * kNr, kNb);
      }
    }
  }
  for (int64_t m = m0; m < m1; ++m) {
    const float* src = acc + (m - m0) * kNb;
    float* dst = y + m * y_stride + n0;
    for (int64_t j = 0; j < n1 - n0; ++j) dst[j] = src[j] + (bias ? bias[n0 + j] : 0.0f);
  }
}

}  // namespace

void GemmTiled(const float* x, int64_t m, int64_t x_stride, const WeightMatrix& w,
               const float* bias, float* y, int64_t y_stride, ThreadPool& pool) {
  if (w.cols == 0) {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < w.rows; ++j) y[i * y_stride + j] = bias ? bias[j] : 0.0f;
    }
    return;
  }
  // Work items are (weight block, slice of M), taken dynamically so a slowed thread does not
  // hold the other at the barrier. Splitting N alone packs every weight once; M is
  // split too only when there are too few blocks to keep every thread busy.
  const int64_t threads = pool.num_threads();
  const int64_t n_blocks = (w.rows + kNb - 1) / kNb;
  int64_t m_parts = 1;
  if (n_blocks < 2 * threads) {
    m_parts = std::clamp<int64_t>((2 * threads + n_blocks - 1) / n_blocks, 1, (m + kMr - 1) / kMr);
  }
  const int64_t m_per_part = ((m + m_parts - 1) / m_parts + kMr - 1) / kMr * kMr;
  // Owned by the calling thread; workers get the pointer (a thread_local named inside the
  // lambda would be each worker's own, empty buffer).
  thread_local std::vector<float> xp_buffer;
  const int64_t m_pad = (m + kMr - 1) / kMr * kMr;
  const int64_t packed_x = m_pad * w.cols;
  if (static_cast<int64_t>(xp_buffer.size()) < packed_x) xp_buffer.resize(packed_x);
  const float* xp = xp_buffer.data();
  PackX(x, m, x_stride, w.cols, xp_buffer.data(), pool);
  auto block = w.dtype == DType::kBF16  ? &Block<DType::kBF16>
               : w.dtype == DType::kF16 ? &Block<DType::kF16>
                                        : &Block<DType::kF32>;
  pool.ParallelForDynamic(n_blocks * m_parts, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t nb = t / m_parts, part = t % m_parts;
      const int64_t r0 = part * m_per_part, r1 = std::min(m, r0 + m_per_part);
      if (r0 >= r1) continue;
      const int64_t n0 = nb * kNb;
      block(xp, m_pad, r0, r1, w, n0, std::min(w.rows, n0 + kNb), bias, y, y_stride);
    }
  });
}

}  // namespace tandem::kernels::internal
