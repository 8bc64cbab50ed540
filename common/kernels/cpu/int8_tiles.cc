#include "common/kernels/cpu/int8_tiles.h"

#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/kernels/cpu/amx.h"
#include "common/kernels/cpu/gemm_internal.h"
#include "common/kernels/cpu/gemm_tiled_parts.h"
#include "common/util/check.h"

#define TANDEM_VNNI512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))
#define TANDEM_AMX_INT8 __attribute__((target("amx-tile,amx-bf16,amx-int8")))

// GCC 12 flags the intrinsics' own _mm512_undefined_* placeholders as maybe-uninitialized.
#if !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace tandem::kernels {
namespace {

constexpr int64_t kSlice = 64;                   // output rows per slice
constexpr int64_t kBlockK = 64;                  // input columns per K block
constexpr int64_t kTileBytes = 1024;             // 16 rows of 64 bytes: 16 outputs x 64 columns
constexpr int64_t kBlockBytes = 4 * kTileBytes;  // a slice's K block
constexpr int64_t kChunk = 16;                   // rows of x per tile call
constexpr int64_t kMaxCols = 65535;              // |t| < 255 * 127 * 65,536 < 2^31
// K blocks a decode step prefetches ahead of its loads (8 KiB of its stream).
constexpr int64_t kVnniPrefetchBlocks = 2;
// K blocks the tiles prefetch ahead into L1 (tile loads do not wake the hardware prefetchers).
constexpr int64_t kTilePrefetchBlocks = 2;
// A call of 5-16 rows (one chunk, the only pass over its slice) reads the slice from memory: it
// also asks for the blocks this far ahead (128 KiB, on into the next slice, which the same thread
// usually takes next) into L2. Calls of more rows ask for the next item's slice instead
// (ForEachRowBlockSlice).
constexpr int64_t kTileStreamBlocks = 32;
// A block of x's rows (int8, in the tile layout) for calls of more than one chunk: at most this
// many bytes, so that it stays in a core's L2 while every slice runs over it (as the bf16 tiles'
// kBlockXBytes).
constexpr int64_t kBlockXBytes = int64_t{1} << 20;

int64_t RoundUp(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

struct Shape {
  int64_t rows;    // padded to kSlice
  int64_t cols;    // padded to kBlockK
  int64_t blocks;  // K blocks

  static Shape Of(int64_t rows, int64_t cols) {
    return {RoundUp(rows, kSlice), RoundUp(cols, kBlockK), RoundUp(cols, kBlockK) / kBlockK};
  }
  int64_t SliceBytes() const { return blocks * kBlockBytes; }
  int64_t CodeBytes() const { return rows * cols; }
  int64_t Bytes() const { return CodeBytes() + rows * (sizeof(float) + sizeof(int32_t)); }
  // Where the code of output n, input column k lies.
  int64_t At(int64_t n, int64_t k) const {
    return (n / kSlice * blocks + k / kBlockK) * kBlockBytes + n % kSlice / 16 * kTileBytes +
           k % kBlockK / 4 * 64 + n % 16 * 4 + k % 4;
  }
};

const char* Codes(const WeightMatrix& w) { return static_cast<const char*>(w.data); }
const float* Scales(const WeightMatrix& w, const Shape& s) {
  return reinterpret_cast<const float*>(Codes(w) + s.CodeBytes());
}
const int32_t* Zeros(const WeightMatrix& w, const Shape& s) {
  return reinterpret_cast<const int32_t*>(Codes(w) + s.CodeBytes() + s.rows * sizeof(float));
}

std::atomic<int64_t> vnni_rows{internal::kInt8VnniRows};
std::atomic<bool> pair_chunks{true};

// AMX-INT8: CPUID leaf 7, EDX bit 25.
bool AmxInt8() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) && (edx >> 25 & 1) != 0;
}

// x rounded to int8, one scale per row (tiled::RoundToInt8, the own integer kernels' codes), zero
// past its k columns up to the padded K (stride). Row-major (row r's codes at q + r * stride), or
// for pairs of chunks on the tiles in the tile layout: per chunk of kChunk rows (kChunk * stride
// bytes), per K block, the chunk's rows of kBlockK codes 64 bytes apart (1 KiB), so that each
// tile load reads one piece of memory (rows stride bytes apart share a few of L1's sets).
struct IntRows {
  const int8_t* q;
  const int32_t* sums;  // sum of row r's codes
  const float* scales;
  int64_t stride;
  bool tile_layout;
};

// Where the tiles read rows [r0, r0 + kChunk) of x: K block kb's rows start at
// data + kb * block_bytes, row_bytes apart.
struct TileX {
  const int8_t* data;
  int64_t row_bytes;
  int64_t block_bytes;
};

TileX ChunkOf(const IntRows& x, int64_t r0) {
  if (x.tile_layout) return {x.q + r0 * x.stride, kBlockK, kChunk * kBlockK};
  return {x.q + r0 * x.stride, x.stride, kBlockK};
}

IntRows QuantizeRows(const float* x, int64_t m, int64_t x_stride, int64_t k, int64_t stride,
                     bool tile_layout, ThreadPool& pool) {
  // The calling thread's; the workers get the pointers.
  thread_local std::vector<int8_t> q;
  thread_local std::vector<int32_t> sums;
  thread_local std::vector<float> scales;
  if (static_cast<int64_t>(q.size()) < RoundUp(m, kChunk) * stride) {
    q.resize(RoundUp(m, kChunk) * stride);
  }
  if (static_cast<int64_t>(sums.size()) < m) {
    sums.resize(m);
    scales.resize(m);
  }
  int8_t* q_data = q.data();
  int32_t* sums_data = sums.data();
  float* scales_data = scales.data();
  auto run = [&](int64_t r0, int64_t r1) {
    thread_local std::vector<int8_t> staged;
    if (tile_layout) staged.resize(stride);
    for (int64_t r = r0; r < r1; ++r) {
      int8_t* row = tile_layout ? staged.data() : q_data + r * stride;
      scales_data[r] = internal::tiled::RoundToInt8(x + r * x_stride, k, row);
      std::memset(row + k, 0, stride - k);
      int32_t sum = 0;
      for (int64_t j = 0; j < k; ++j) sum += row[j];
      sums_data[r] = sum;
      if (!tile_layout) continue;
      int8_t* chunk = q_data + r / kChunk * kChunk * stride + r % kChunk * kBlockK;
      for (int64_t kb = 0; kb < stride / kBlockK; ++kb) {
        std::memcpy(chunk + kb * kChunk * kBlockK, row + kb * kBlockK, kBlockK);
      }
    }
  };
  constexpr int64_t kGrain = 32;  // a decode step's few rows are not worth waking the pool
  if (m <= kGrain) {
    run(0, m);
  } else {
    pool.ParallelFor(m, kGrain, run);
  }
  return {q_data, sums_data, scales_data, stride, tile_layout};
}

// What a call writes: `count` (<= kSlice) outputs of a slice, from output n0 of a product.
struct SliceOut {
  const char* codes;  // the slice's
  const float* scales;
  const int32_t* zeros;
  const float* bias;  // null: none
  float* y;           // row 0, output n0
  int64_t y_stride;
  int64_t count;
};

// Sixteen outputs of one row from their integer sums t = sum xq * code: t - zero * sum(xq),
// then fma(float(t) * s_x, s_w, bias). Every kernel ends here: the same operations, the same
// bits.
TANDEM_VNNI512 inline void Finish(__m512i t, const SliceOut& o, int64_t part, int32_t sum_x,
                                  float s_x, float* y) {
  const int64_t left = o.count - 16 * part;
  if (left <= 0) return;
  const __mmask16 mask = left >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << left) - 1);
  const __m512i zero = _mm512_loadu_si512(o.zeros + 16 * part);
  t = _mm512_sub_epi32(t, _mm512_mullo_epi32(zero, _mm512_set1_epi32(sum_x)));
  const __m512 p = _mm512_mul_ps(_mm512_cvtepi32_ps(t), _mm512_set1_ps(s_x));
  const __m512 bias =
      o.bias != nullptr ? _mm512_maskz_loadu_ps(mask, o.bias + 16 * part) : _mm512_setzero_ps();
  const __m512 out = _mm512_fmadd_ps(p, _mm512_loadu_ps(o.scales + 16 * part), bias);
  _mm512_mask_storeu_ps(y + 16 * part, mask, out);
}

inline int32_t Load4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// R (1..4) rows of x from row r0 times one slice on vpdpbusd: one lane per output, 4 x 16
// outputs, each row's 4 codes broadcast.
template <int R>
TANDEM_VNNI512 void VnniRows(const IntRows& x, int64_t r0, int64_t blocks, const SliceOut& o) {
  __m512i acc[R][4];
  TANDEM_UNROLL
  for (int i = 0; i < R; ++i) {
    TANDEM_UNROLL
    for (int t = 0; t < 4; ++t) acc[i][t] = _mm512_setzero_si512();
  }
  const int8_t* rows[R];
  TANDEM_UNROLL
  for (int i = 0; i < R; ++i) rows[i] = x.q + (r0 + i) * x.stride;
  for (int64_t kb = 0; kb < blocks; ++kb) {
    const char* block = o.codes + kb * kBlockBytes;
    const char* ahead = block + kVnniPrefetchBlocks * kBlockBytes;
    TANDEM_UNROLL
    for (int64_t q = 0; q < 16; ++q) {
      // Past the slice's end this reads ahead into the next slice, which the same thread
      // usually takes next; a prefetch never faults.
      TANDEM_UNROLL
      for (int t = 0; t < 4; ++t) _mm_prefetch(ahead + t * kTileBytes + q * 64, _MM_HINT_T0);
      __m512i xq[R];
      TANDEM_UNROLL
      for (int i = 0; i < R; ++i) xq[i] = _mm512_set1_epi32(Load4(rows[i] + kb * kBlockK + q * 4));
      TANDEM_UNROLL
      for (int t = 0; t < 4; ++t) {
        const __m512i w = _mm512_load_si512(block + t * kTileBytes + q * 64);
        TANDEM_UNROLL
        for (int i = 0; i < R; ++i) acc[i][t] = _mm512_dpbusd_epi32(acc[i][t], w, xq[i]);
      }
    }
  }
  for (int i = 0; i < R; ++i) {
    float* y = o.y + (r0 + i) * o.y_stride;
    for (int t = 0; t < 4; ++t) Finish(acc[i][t], o, t, x.sums[r0 + i], x.scales[r0 + i], y);
  }
}

void VnniRange(const IntRows& x, int64_t r0, int64_t r1, int64_t blocks, const SliceOut& o) {
  for (; r0 + 4 <= r1; r0 += 4) VnniRows<4>(x, r0, blocks, o);
  switch (r1 - r0) {
    case 3:
      return VnniRows<3>(x, r0, blocks, o);
    case 2:
      return VnniRows<2>(x, r0, blocks, o);
    case 1:
      return VnniRows<1>(x, r0, blocks, o);
    default:
      return;
  }
}

// c[rows][kSlice] (int32) = `rows` (1..16) rows of x times one slice, on the tiles: per 16
// outputs one accumulator tile, tdpbsud (x signed, codes unsigned) over the K blocks.
TANDEM_AMX_INT8 void TileRows(TileX x, int64_t rows, const char* slice, int64_t blocks, bool stream,
                              int32_t* c) {
  // Tiles 0-3 accumulate the four 16-output parts; 4 holds x; 5-7 a block's codes.
  const auto r = static_cast<uint8_t>(rows);
  internal::LoadTileConfig({r, r, r, r, r, 16, 16, 16});
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t kb = 0; kb < blocks; ++kb) {
    const char* block = slice + kb * kBlockBytes;
    const char* ahead = block + kTilePrefetchBlocks * kBlockBytes;
    for (int64_t line = 0; line < kBlockBytes; line += 64) _mm_prefetch(ahead + line, _MM_HINT_T0);
    if (stream) {
      const char* far = block + kTileStreamBlocks * kBlockBytes;
      for (int64_t line = 0; line < kBlockBytes; line += 64) _mm_prefetch(far + line, _MM_HINT_T1);
    }
    _tile_loadd(4, x.data + kb * x.block_bytes, x.row_bytes);
    _tile_loadd(5, block, 64);
    _tile_dpbsud(0, 4, 5);
    _tile_loadd(6, block + kTileBytes, 64);
    _tile_dpbsud(1, 4, 6);
    _tile_loadd(7, block + 2 * kTileBytes, 64);
    _tile_dpbsud(2, 4, 7);
    _tile_loadd(5, block + 3 * kTileBytes, 64);
    _tile_dpbsud(3, 4, 5);
  }
  constexpr int64_t kRowBytes = kSlice * sizeof(int32_t);
  _tile_stored(0, c, kRowBytes);
  _tile_stored(1, c + 16, kRowBytes);
  _tile_stored(2, c + 32, kRowBytes);
  _tile_stored(3, c + 48, kRowBytes);
}

// c[kChunk + rows1][kSlice] (int32) = a chunk of kChunk rows of x and then `rows1` (1..16) rows
// of the next chunk times one slice. Per half of the slice's outputs, 2 x 2 accumulator tiles take
// 2 x tiles and 2 code tiles per K block: 4 tile loads for 4 products, where TileRows takes 5.
// The sums are exact integers, so they are TileRows' whatever the order.
TANDEM_AMX_INT8 void TilePair(TileX x0, TileX x1, int64_t rows1, const char* slice, int64_t blocks,
                              bool stream, int32_t* c, internal::Ahead ahead = {}) {
  // Tiles 0-1: the first chunk x 2 x 16 outputs; 2-3: the second's; 4-5 the chunks' x; 6-7 codes.
  const auto r = static_cast<uint8_t>(rows1);
  internal::LoadTileConfig({16, 16, r, r, 16, r, 16, 16});
  constexpr int64_t kRowBytes = kSlice * sizeof(int32_t);
  for (int64_t half = 0; half < 2; ++half) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t kb = 0; kb < blocks; ++kb) {
      const char* block = slice + kb * kBlockBytes + half * 2 * kTileBytes;
      const char* near = block + kTilePrefetchBlocks * kBlockBytes;
      for (int64_t line = 0; line < 2 * kTileBytes; line += 64) {
        _mm_prefetch(near + line, _MM_HINT_T0);
      }
      if (stream && half == 0) {
        const char* far = slice + (kb + kTileStreamBlocks) * kBlockBytes;
        for (int64_t line = 0; line < kBlockBytes; line += 64) {
          _mm_prefetch(far + line, _MM_HINT_T1);
        }
      }
      ahead.Step(half * blocks + kb, 2 * blocks);
      _tile_loadd(4, x0.data + kb * x0.block_bytes, x0.row_bytes);
      _tile_loadd(6, block, 64);
      _tile_dpbsud(0, 4, 6);
      _tile_loadd(5, x1.data + kb * x1.block_bytes, x1.row_bytes);
      _tile_dpbsud(2, 5, 6);
      _tile_loadd(7, block + kTileBytes, 64);
      _tile_dpbsud(1, 4, 7);
      _tile_dpbsud(3, 5, 7);
    }
    int32_t* out = c + half * 32;
    _tile_stored(0, out, kRowBytes);
    _tile_stored(1, out + 16, kRowBytes);
    _tile_stored(2, out + kChunk * kSlice, kRowBytes);
    _tile_stored(3, out + kChunk * kSlice + 16, kRowBytes);
  }
}

TANDEM_VNNI512 void FinishRows(const int32_t* c, const IntRows& x, int64_t r0, int64_t rows,
                               const SliceOut& o) {
  for (int64_t i = 0; i < rows; ++i) {
    float* y = o.y + (r0 + i) * o.y_stride;
    for (int t = 0; t < 4; ++t) {
      Finish(_mm512_load_si512(c + i * kSlice + 16 * t), o, t, x.sums[r0 + i], x.scales[r0 + i],
             y);
    }
  }
}

// Rows [r0, r1) times one slice, two chunks of kChunk rows a pass where `pairs`. The first call
// streams the slice from memory unless `ahead` (the next slice, asked into L2 by the pairs'
// calls) says a previous item asked for this one.
void TileRange(const IntRows& x, int64_t r0, int64_t r1, int64_t blocks, bool pairs,
               const SliceOut& o, internal::Ahead ahead = {}) {
  alignas(64) thread_local int32_t c[2 * kChunk * kSlice];
  const int64_t unit = (pairs ? 2 : 1) * kChunk, calls = (r1 - r0 + unit - 1) / unit;
  for (int64_t call = 0; r0 < r1; ++call) {
    const int64_t rows = std::min(unit, r1 - r0);
    const bool first = call == 0 && ahead.data == nullptr;
    if (rows > kChunk) {
      const internal::Ahead part{ahead.data + ahead.bytes * call / calls,
                                 ahead.bytes * (call + 1) / calls - ahead.bytes * call / calls};
      TilePair(ChunkOf(x, r0), ChunkOf(x, r0 + kChunk), rows - kChunk, o.codes, blocks, first, c,
               part);
    } else {
      TileRows(ChunkOf(x, r0), rows, o.codes, blocks, first, c);
    }
    FinishRows(c, x, r0, rows, o);
    r0 += rows;
  }
}

}  // namespace

bool Int8TilesFit(const QuantFormat& f, int64_t cols) {
  static const bool cpu = internal::AmxTilesAllowed() && AmxInt8() &&
                          __builtin_cpu_supports("avx512vnni") &&
                          __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq");
  const int64_t group = f.group_size > 0 ? f.group_size : cols;
  return cpu && f.bits == 8 && group == cols && f.int8_activations && f.activation_block == 0 &&
         cols > 0 && cols <= kMaxCols;
}

int64_t Int8TilesBytes(int64_t rows, int64_t cols) { return Shape::Of(rows, cols).Bytes(); }

WeightMatrix PackInt8Tiles(const QuantFormat& f, DType dtype, int64_t rows, int64_t cols,
                           const QuantRowSource& source, void* out, ThreadPool& pool) {
  const int64_t group = f.group_size > 0 ? f.group_size : cols;
  TANDEM_CHECK(f.bits == 8 && group == cols, "int8 tiles hold 8-bit codes, one scale per row");
  const Shape s = Shape::Of(rows, cols);
  auto* codes = static_cast<uint8_t*>(out);
  auto* scales = reinterpret_cast<float*>(codes + s.CodeBytes());
  auto* zeros = reinterpret_cast<int32_t*>(codes + s.CodeBytes() + s.rows * sizeof(float));
  pool.ParallelFor(s.rows / kSlice, 1, [&](int64_t s0, int64_t s1) {
    std::vector<uint8_t> row(cols);
    for (int64_t n = s0 * kSlice; n < std::min(rows, s1 * kSlice); ++n) {
      float scale = 0.0f;
      uint8_t zero = 1 << 7;
      source(n, row.data(), &scale, &zero);
      // Each 4 columns' codes in one piece; the last block's missing columns stay zero.
      uint8_t* out_n = codes + s.At(n, 0);
      for (int64_t k = 0; k < cols; k += 4) {
        std::memcpy(out_n + k / kBlockK * kBlockBytes + k % kBlockK / 4 * 64, row.data() + k,
                    std::min<int64_t>(4, cols - k));
      }
      scales[n] = scale;
      zeros[n] = f.has_zero ? zero : 1 << 7;
    }
  });
  return WeightMatrix{.data = out,
                      .dtype = dtype,
                      .rows = rows,
                      .cols = cols,
                      .layout = WeightLayout::kInt8Tiles,
                      .quant = f};
}

void ReadInt8TilesRow(const WeightMatrix& w, int64_t row, uint8_t* codes, float* scales,
                      uint8_t* zeros) {
  const Shape s = Shape::Of(w.rows, w.cols);
  for (int64_t k = 0; k < w.cols; ++k) codes[k] = static_cast<uint8_t>(Codes(w)[s.At(row, k)]);
  scales[0] = Scales(w, s)[row];
  zeros[0] = static_cast<uint8_t>(Zeros(w, s)[row]);
}

std::string Int8TilesKernelName() {
  return absl::StrCat("integer (AMX-INT8 tdpbsud; AVX512-VNNI vpdpbusd up to ",
                      vnni_rows.load(std::memory_order_relaxed), " rows)");
}

namespace internal {

int64_t SetInt8VnniRows(int64_t rows) { return vnni_rows.exchange(rows); }

bool PairInt8Chunks(bool pair) { return pair_chunks.exchange(pair); }

void GemmInt8Tiles(const float* x, int64_t m, int64_t x_stride, std::span<const GemmOutput> outputs,
                   ThreadPool& pool) {
  if (m <= 0 || outputs.empty()) return;
  const int64_t k = outputs.front().w.cols;
  const int64_t blocks = Shape::Of(1, k).blocks;
  const bool vnni = m <= vnni_rows.load(std::memory_order_relaxed);
  const bool pairs = pair_chunks.load(std::memory_order_relaxed);
  // Not for a single chunk, which gains nothing from the tile layout (as the bf16 tiles).
  const bool tile_layout = !vnni && pairs && m > kChunk;
  const IntRows xq = QuantizeRows(x, m, x_stride, k, blocks * kBlockK, tile_layout, pool);
  auto slice_out = [](const GemmOutput& o, int64_t slice) {
    const Shape s = Shape::Of(o.w.rows, o.w.cols);
    const int64_t n0 = slice * kSlice;
    return SliceOut{Codes(o.w) + slice * s.SliceBytes(),
                    Scales(o.w, s) + n0,
                    Zeros(o.w, s) + n0,
                    o.bias != nullptr ? o.bias + n0 : nullptr,
                    o.y + n0,
                    o.y_stride,
                    std::min(kSlice, o.w.rows - n0)};
  };
  if (tile_layout) {
    // A prefill or a decode step of 17-32 rows: in blocks of x's rows that stay in L2 (as the
    // bf16 tiles, onednn_gemm.cc), each item asking for the next one's slice (the 32-row GEMM at
    // 8,192 x 2,048 1.10-1.23x against streaming each slice within its first call).
    internal::ForEachRowBlockSlice(
        outputs, m, kSlice, 2 * kChunk, kBlockXBytes / xq.stride, pool,
        [&](const GemmOutput& o, int64_t slice, int64_t r0, int64_t r1, const GemmOutput& next,
            int64_t next_slice) {
          const Shape s = Shape::Of(next.w.rows, next.w.cols);
          const internal::Ahead ahead{Codes(next.w) + next_slice * s.SliceBytes(),
                                      blocks * kBlockBytes};
          TileRange(xq, r0, r1, blocks, pairs, slice_out(o, slice), ahead);
        });
    return;
  }
  // Work items: (slice of one output, part of the rows), parts of whole pairs of chunks; a
  // decode step's rows are not split.
  internal::ForEachSlice(outputs, m, kSlice, kChunk, pairs ? 2 : 1, /*split_rows=*/!vnni, pool,
                         [&](const GemmOutput& o, int64_t slice, int64_t r0, int64_t r1) {
                           if (vnni) {
                             VnniRange(xq, r0, r1, blocks, slice_out(o, slice));
                           } else {
                             TileRange(xq, r0, r1, blocks, pairs, slice_out(o, slice));
                           }
                         });
}

}  // namespace internal
}  // namespace tandem::kernels

#if !defined(__clang__)
#pragma GCC diagnostic pop
#endif
