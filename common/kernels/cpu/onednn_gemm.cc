#include "common/kernels/cpu/onednn_gemm.h"

#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <map>
#include <random>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/kernels/cpu/amx.h"
#include "common/kernels/cpu/gemm_internal.h"
#include "common/util/check.h"
#include "oneapi/dnnl/dnnl.hpp"

// libgomp's, which oneDNN runs on (declared here: clang's omp.h would be another runtime's).
extern "C" void omp_set_num_threads(int num_threads);

namespace tandem::kernels {

bool internal::AmxTilesAllowed() {
  static const bool allowed = [] {
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return OnednnCpuInfo().amx &&
           syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return allowed;
}

namespace {

using dnnl::memory;
using internal::Ahead;
using internal::AmxTilesAllowed;
using internal::LoadTileConfig;
constexpr int64_t kChunk = kOnednnChunkRows;
constexpr int64_t kSlice = kOnednnSliceRows;
constexpr int64_t kAlign = 64;

dnnl::engine& Engine() {
  static dnnl::engine* engine = new dnnl::engine(dnnl::engine::kind::cpu, 0);
  return *engine;
}

// oneDNN's OpenMP runs one thread in each thread that calls it: the pool's threads are the
// parallelism (two cores mean two busy threads, not one team per pool thread).
void SingleThreaded() {
  thread_local bool set = [] {
    omp_set_num_threads(1);
    return true;
  }();
  (void)set;
}

memory::data_type DataType(DType dtype) {
  return dtype == DType::kBF16 ? memory::data_type::bf16 : memory::data_type::f32;
}

int64_t RoundUp(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

// One shape's primitives: a slice of kSlice output rows times 1..kChunk rows of x.
struct Plan {
  int id = 0;  // its index among all plans (ThreadCalls keeps its objects by it)
  DType dtype = DType::kF32;
  int64_t k = 0;
  memory::desc weights;  // one slice, in the layout the 16-row primitive chose
  int64_t slice_bytes = 0;
  std::array<dnnl::matmul, kChunk + 1> by_rows;  // [r]: r rows of x (empty where unused)
  std::array<int64_t, kChunk + 1> run_rows{};    // the primitive r rows run on (r or kChunk)
  std::array<memory::desc, kChunk + 1> scratchpads;
  dnnl::reorder unpack;  // a slice back to f32 rows [kSlice][k] (ReadOnednnRow)
  std::string impl;      // the 16-row primitive's implementation
  std::string padding;   // which row counts run padded to kChunk, and why (empty if none)
  // [r]: r rows run on TileRows (the own AMX kernel), checked to give the 16-row primitive's
  // bits; the primitives are not used then.
  std::array<bool, kChunk + 1> tiles{};
  // Every row count runs on the tiles and TilePair gives the same bits: x is then laid out in
  // tile blocks (TileX) and two chunks share each weight tile.
  bool pairs = false;
};

// The own AMX kernel (TileRows) reads bf16 slices in the layout oneDNN's AMX brgemm chose:
// blocks of 32 input columns (16 pairs) x 64 output rows x 2, one after another along K.
constexpr int64_t kTileK = 32;
constexpr int64_t kTileBlockBytes = kTileK * kSlice * 2;
// Blocks prefetched ahead into L1: AMX tile loads do not wake the hardware prefetchers, and a
// step of a few rows streams its weights from memory (measured: 5 GB/s without, 22 with, the
// rate of plain vector loads, on one Xeon core).
constexpr int64_t kTilePrefetchBlocks = 3;

// Whether `p`'s slices are in the layout TileRows reads.
bool TileLayout(const Plan& p) {
  if (p.dtype != DType::kBF16 || p.k % kTileK != 0 || !AmxTilesAllowed()) return false;
  const dnnl_memory_desc_t& d = p.weights.data;
  if (d.format_kind != dnnl_blocked || d.padded_dims[0] != p.k || d.padded_dims[1] != kSlice) {
    return false;
  }
  const dnnl_blocking_desc_t& b = d.format_desc.blocking;
  return b.inner_nblks == 3 && b.inner_blks[0] == 16 && b.inner_idxs[0] == 0 &&
         b.inner_blks[1] == kSlice && b.inner_idxs[1] == 1 && b.inner_blks[2] == 2 &&
         b.inner_idxs[2] == 0 && b.strides[0] == kTileK * kSlice &&
         p.slice_bytes == p.k * kSlice * 2;
}

// Where a chunk of up to kChunk rows of x (bf16) lies for the tiles: row i's K block kb starts at
// data + i * row_bytes + kb * block_bytes. Row-major rows of k values have (2k, 64); the tile
// layout GemmOnednn writes has (64, kChunk * 64): each tile load reads 1 KiB in one piece.
struct TileX {
  const char* data;
  int64_t row_bytes;
  int64_t block_bytes;
};

TileX RowMajor(const uint16_t* x, int64_t k) {
  return {reinterpret_cast<const char*>(x), k * 2, kTileK * 2};
}

// A chunk in the tile layout: rows 64 bytes apart, K blocks kChunk * 64 bytes apart.
constexpr int64_t kTileXBlockBytes = kChunk * kTileK * 2;
TileX TileLayoutX(const char* x) { return {x, kTileK * 2, kTileXBlockBytes}; }

// Prefetches `lines` cache lines from each of a slice block's 16 pair rows, starting at `block`,
// into L1 (AMX tile loads do not wake the hardware prefetchers).
void PrefetchBlock(const char* block, int64_t lines) {
  constexpr int64_t kPairRowBytes = kSlice * 2 * 2;
  for (int64_t b = 0; b < kTileBlockBytes; b += kPairRowBytes) {
    for (int64_t l = 0; l < lines; ++l) _mm_prefetch(block + b + l * 64, _MM_HINT_T0);
  }
}

// K blocks [begin, end) of a call: the whole of K, or a range of it whose sums continue from the
// ones the ranges before it left in y (stored and reloaded exactly: the bits do not change).
struct KBlocks {
  int64_t begin = 0, end = 0;
};
KBlocks AllOf(int64_t k) { return {0, k / kTileK}; }

// Where accumulator tiles 0-3 live in y between ranges of K: four blocks of f32 rows, each
// `stride` bytes apart.
struct Accumulators {
  float* at[4];
  int64_t stride;
};

// Zeroes tiles 0-3 for a call's first K block, or reloads them from where the ranges before it
// left their sums.
TANDEM_AMX inline void StartAccumulators(bool first, const Accumulators& a) {
  if (first) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    return;
  }
  _tile_loadd(0, a.at[0], a.stride);
  _tile_loadd(1, a.at[1], a.stride);
  _tile_loadd(2, a.at[2], a.stride);
  _tile_loadd(3, a.at[3], a.stride);
}

TANDEM_AMX inline void StoreAccumulators(const Accumulators& a) {
  _tile_stored(0, a.at[0], a.stride);
  _tile_stored(1, a.at[1], a.stride);
  _tile_stored(2, a.at[2], a.stride);
  _tile_stored(3, a.at[3], a.stride);
}

// y[rows][kSlice] (rows y_stride floats apart) = x's `rows` rows times one slice in TileLayout,
// as oneDNN's AMX brgemm computes it: per 16 output columns one accumulator tile, tdpbf16ps over
// the K blocks in order.
TANDEM_AMX void TileRows(TileX x, int64_t rows, KBlocks kbs, const char* slice, float* y,
                         int64_t y_stride) {
  // Tiles 0-3 accumulate y's four 16-column parts; 4 holds x; 5-7 a block's 16 pairs x 16
  // columns.
  const auto r = static_cast<uint8_t>(rows);
  LoadTileConfig({r, r, r, r, r, 16, 16, 16});
  const Accumulators acc{{y, y + 16, y + 32, y + 48}, y_stride * 4};
  StartAccumulators(kbs.begin == 0, acc);
  constexpr int64_t kPairRowBytes = kSlice * 2 * 2;  // a block's row: 64 columns x 2 bf16
  for (int64_t kb = kbs.begin; kb < kbs.end; ++kb) {
    const char* block = slice + kb * kTileBlockBytes;
    // Past the slice's end this reads ahead into the next slice, which the same thread usually
    // takes next; a prefetch never faults.
    PrefetchBlock(block + kTilePrefetchBlocks * kTileBlockBytes, 4);
    _tile_loadd(4, x.data + kb * x.block_bytes, x.row_bytes);
    _tile_loadd(5, block, kPairRowBytes);
    _tile_dpbf16ps(0, 4, 5);
    _tile_loadd(6, block + 64, kPairRowBytes);
    _tile_dpbf16ps(1, 4, 6);
    _tile_loadd(7, block + 128, kPairRowBytes);
    _tile_dpbf16ps(2, 4, 7);
    _tile_loadd(5, block + 192, kPairRowBytes);
    _tile_dpbf16ps(3, 4, 5);
  }
  StoreAccumulators(acc);
}

// y[kChunk + rows1][kSlice] (rows y_stride floats apart) = kChunk rows of x0 and then `rows1`
// (1..kChunk) rows of x1 times one slice, with TileRows' bits: each output still accumulates in its
// own tile over the K blocks in order. Two chunks share each weight tile: per half of the slice's
// columns, 2 x 2 accumulator tiles take 2 x tiles and 2 weight tiles per K block, 4 loads for 4
// products where TileRows takes 5 (tile loads are what bounds the tiles: docs/benchmarks.md).
TANDEM_AMX void TilePair(TileX x0, TileX x1, int64_t rows1, KBlocks kbs, const char* slice,
                         float* y, int64_t y_stride, Ahead ahead = {}) {
  // Tiles 0-1: x0's rows x 2 x 16 columns; 2-3: x1's; 4: x0's block; 5: x1's; 6-7 weights.
  const auto r = static_cast<uint8_t>(rows1);
  LoadTileConfig({16, 16, r, r, 16, r, 16, 16});
  constexpr int64_t kPairRowBytes = kSlice * 2 * 2;
  // The halves take turns over runs of K blocks, so that the second reads x's run from L2; the
  // accumulators wait in y in between (stored and reloaded exactly: the bits are unchanged).
  constexpr int64_t kRunBlocks = 64;
  const int64_t steps = 2 * (kbs.end - kbs.begin);
  int64_t step = 0;
  for (int64_t kb0 = kbs.begin; kb0 < kbs.end; kb0 += kRunBlocks) {
    for (int64_t half = 0; half < 2; ++half) {
      float* out = y + half * 32;
      const Accumulators acc{{out, out + 16, out + kChunk * y_stride, out + kChunk * y_stride + 16},
                             y_stride * 4};
      StartAccumulators(kb0 == 0, acc);
      for (int64_t kb = kb0; kb < std::min(kbs.end, kb0 + kRunBlocks); ++kb) {
        const char* block = slice + kb * kTileBlockBytes + half * 128;
        PrefetchBlock(block + kTilePrefetchBlocks * kTileBlockBytes, 2);
        ahead.Step(step++, steps);
        _tile_loadd(4, x0.data + kb * x0.block_bytes, x0.row_bytes);
        _tile_loadd(6, block, kPairRowBytes);
        _tile_dpbf16ps(0, 4, 6);
        _tile_loadd(5, x1.data + kb * x1.block_bytes, x1.row_bytes);
        _tile_dpbf16ps(2, 5, 6);
        _tile_loadd(7, block + 64, kPairRowBytes);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(3, 5, 7);
      }
      StoreAccumulators(acc);
    }
  }
}

memory::desc RowsDesc(int64_t k) {
  return memory::desc({k, kSlice}, memory::data_type::f32, memory::format_tag::ba);
}

memory Wrap(const memory::desc& desc, void* data) { return memory(desc, Engine(), data); }

memory::desc XDesc(const Plan& p, int64_t rows) {
  return memory::desc({rows, p.k}, DataType(p.dtype), memory::format_tag::ab);
}
memory::desc YDesc(int64_t rows) {
  return memory::desc({rows, kSlice}, memory::data_type::f32, memory::format_tag::ab);
}

dnnl::matmul::primitive_desc Describe(const Plan& p, int64_t rows, const memory::desc& weights) {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return dnnl::matmul::primitive_desc(dnnl::matmul::desc(XDesc(p, rows), weights, YDesc(rows)),
                                      attr, Engine());
}

// Reorders row-major rows [kSlice][k] of `dtype` into `out` in the plan's layout.
void PackSlice(const Plan& p, const void* rows, void* out) {
  const memory::desc plain({p.k, kSlice}, DataType(p.dtype), memory::format_tag::ba);
  memory src = Wrap(plain, const_cast<void*>(rows));
  memory dst = Wrap(p.weights, out);
  dnnl::stream stream(Engine());
  dnnl::reorder(src, dst).execute(stream, src, dst);
  stream.wait();
}

// Runs `rows` rows of x (contiguous, the plan's dtype) through the r-row primitive against one
// packed slice into y [rows][kSlice]: the plan check's and ReadOnednnRow's slow path.
void RunOnce(const Plan& p, int64_t rows, const void* x, const void* slice, float* y) {
  std::vector<char> scratch(p.scratchpads[rows].get_size() + 1);
  memory src = Wrap(XDesc(p, rows), const_cast<void*>(x));
  memory w = Wrap(p.weights, const_cast<void*>(slice));
  memory dst = Wrap(YDesc(rows), y);
  memory pad = Wrap(p.scratchpads[rows], scratch.data());
  dnnl::stream stream(Engine());
  p.by_rows[rows].execute(stream, {{DNNL_ARG_SRC, src},
                                   {DNNL_ARG_WEIGHTS, w},
                                   {DNNL_ARG_DST, dst},
                                   {DNNL_ARG_SCRATCHPAD, pad}});
  stream.wait();
}

// Checks on random data that each row count's primitive gives every row the bits the 16-row
// primitive gives it, wherever the row sits in the call; pads the counts that do not.
absl::Status CheckInvariance(Plan& p) {
  std::mt19937 rng(17);
  std::normal_distribution<float> normal;
  const int64_t elem = p.dtype == DType::kBF16 ? 2 : 4;
  auto random_rows = [&](int64_t rows) {
    std::vector<char> bytes(rows * p.k * elem);
    for (int64_t i = 0; i < rows * p.k; ++i) {
      const float v = normal(rng);
      if (p.dtype == DType::kBF16) {
        const uint16_t b = F32ToBf16(v);
        std::memcpy(bytes.data() + i * 2, &b, 2);
      } else {
        std::memcpy(bytes.data() + i * 4, &v, 4);
      }
    }
    return bytes;
  };
  const std::vector<char> w_rows = random_rows(kSlice), x = random_rows(kChunk);
  std::vector<char> slice(p.slice_bytes + kAlign);
  char* packed = reinterpret_cast<char*>(RoundUp(reinterpret_cast<intptr_t>(slice.data()), kAlign));
  PackSlice(p, w_rows.data(), packed);
  std::vector<float> ref(kChunk * kSlice), y(kChunk * kSlice);
  RunOnce(p, kChunk, x.data(), packed, ref.data());
  auto same_rows = [&](int64_t from, int64_t count, int64_t at) {
    return std::memcmp(ref.data() + from * kSlice, y.data() + at * kSlice,
                       count * kSlice * sizeof(float)) == 0;
  };
  // The 16-row primitive with x's rows rotated: a row's bits must not depend on its position.
  constexpr int64_t kShift = 5;
  std::vector<char> rotated(x.size());
  const int64_t row_bytes = p.k * elem;
  for (int64_t r = 0; r < kChunk; ++r) {
    std::memcpy(rotated.data() + (r + kShift) % kChunk * row_bytes, x.data() + r * row_bytes,
                row_bytes);
  }
  RunOnce(p, kChunk, rotated.data(), packed, y.data());
  if (!same_rows(0, kChunk - kShift, kShift) || !same_rows(kChunk - kShift, kShift, 0)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "oneDNN's ", p.impl, " gives a row different bits at another position in the batch"));
  }
  for (int64_t r = 1; r < kChunk; ++r) {
    if (p.run_rows[r] != r) continue;
    // The first r rows, then the last r rows, of the reference call.
    RunOnce(p, r, x.data(), packed, y.data());
    bool same = same_rows(0, r, 0);
    RunOnce(p, r, x.data() + (kChunk - r) * row_bytes, packed, y.data());
    same = same && same_rows(kChunk - r, r, 0);
    if (!same) p.run_rows[r] = kChunk;
  }
  if (TileLayout(p)) {
    const auto* xs = reinterpret_cast<const uint16_t*>(x.data());
    for (int64_t r = 1; r <= kChunk; ++r) {
      TileRows(RowMajor(xs, p.k), r, AllOf(p.k), packed, y.data(), kSlice);
      bool same = same_rows(0, r, 0);
      TileRows(RowMajor(xs + (kChunk - r) * p.k, p.k), r, AllOf(p.k), packed, y.data(), kSlice);
      p.tiles[r] = same && same_rows(kChunk - r, r, 0);
    }
    // Pairs: x, then the first r rows of x rotated, whose rows the rotated reference call gave.
    p.pairs = std::count(p.tiles.begin() + 1, p.tiles.end(), true) == kChunk;
    std::vector<float> ref_rotated(kChunk * kSlice), pair(2 * kChunk * kSlice);
    RunOnce(p, kChunk, rotated.data(), packed, ref_rotated.data());
    const auto* rs = reinterpret_cast<const uint16_t*>(rotated.data());
    for (int64_t r = 1; r <= kChunk && p.pairs; ++r) {
      TilePair(RowMajor(xs, p.k), RowMajor(rs, p.k), r, AllOf(p.k), packed, pair.data(), kSlice);
      p.pairs = std::memcmp(pair.data(), ref.data(), ref.size() * sizeof(float)) == 0 &&
                std::memcmp(pair.data() + kChunk * kSlice, ref_rotated.data(),
                            r * kSlice * sizeof(float)) == 0;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Plan>> MakePlan(DType dtype, int64_t k) {
  if (dtype != DType::kF32 && dtype != DType::kBF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.cpu_gemm: onednn multiplies f32, bf16 and f16 weights, not ",
                     std::string(DTypeName(dtype))));
  }
  SingleThreaded();
  auto p = std::make_unique<Plan>();
  p->dtype = dtype;
  p->k = k;
  try {
    const memory::desc any({k, kSlice}, DataType(dtype), memory::format_tag::any);
    dnnl::matmul::primitive_desc full = Describe(*p, kChunk, any);
    p->weights = full.weights_desc();
    p->slice_bytes = RoundUp(static_cast<int64_t>(p->weights.get_size()), kAlign);
    p->impl = full.impl_info_str();
    p->by_rows[kChunk] = dnnl::matmul(full);
    p->scratchpads[kChunk] = full.scratchpad_desc();
    p->unpack =
        dnnl::reorder(dnnl::reorder::primitive_desc(Engine(), p->weights, Engine(), RowsDesc(k)));
    p->run_rows[kChunk] = kChunk;
    std::array<std::string, kChunk + 1> impls;
    impls[kChunk] = p->impl;
    for (int64_t r = 1; r < kChunk; ++r) {
      p->run_rows[r] = kChunk;
      try {
        const dnnl::matmul::primitive_desc pd = Describe(*p, r, p->weights);
        p->by_rows[r] = dnnl::matmul(pd);
        p->scratchpads[r] = pd.scratchpad_desc();
        p->run_rows[r] = r;
        impls[r] = pd.impl_info_str();
      } catch (const dnnl::error&) {
        // No implementation reads the 16-row layout at r rows: r rows are padded to 16.
        impls[r] = "none";
      }
    }
    if (absl::Status s = CheckInvariance(*p); !s.ok()) return s;
    // Counts on the tiles run as themselves, whatever their primitive's check said.
    std::array<int64_t, kChunk + 1> runs_as = p->run_rows;
    for (int64_t r = 1; r <= kChunk; ++r) {
      if (p->tiles[r]) runs_as[r] = r;
    }
    p->padding = internal::DescribeRowPadding(runs_as, impls);
    const int64_t tiled = std::count(p->tiles.begin(), p->tiles.end(), true);
    if (tiled > 0) {
      const std::string rows =
          tiled == kChunk ? absl::StrCat("1-", kChunk) : absl::StrCat(tiled, " row counts");
      p->padding =
          absl::StrCat(rows, " rows on Tandem's AMX tiles", p->pairs ? ", two chunks a pass" : "",
                       ", the same bits", p->padding.empty() ? "" : "; ", p->padding);
    }
  } catch (const dnnl::error& e) {
    return absl::InvalidArgumentError(absl::StrCat("model.cpu_gemm: onednn has no ",
                                                   std::string(DTypeName(dtype)), " matmul with ",
                                                   k, " input columns on this CPU: ", e.what()));
  }
  return p;
}

// Plans by shape, made at load and kept for the process's life (a handful per model).
class Plans {
 public:
  absl::StatusOr<const Plan*> Get(DType dtype, int64_t k) {
    {
      absl::MutexLock lock(&mu_);
      auto it = plans_.find({dtype, k});
      if (it != plans_.end()) return it->second.get();
    }
    // Made without the lock (it runs oneDNN); a plan another thread made meanwhile wins.
    auto plan = MakePlan(dtype, k);
    if (!plan.ok()) return plan.status();
    absl::MutexLock lock(&mu_);
    (*plan)->id = static_cast<int>(plans_.size());
    return plans_.emplace(std::pair{dtype, k}, std::move(*plan)).first->second.get();
  }

 private:
  absl::Mutex mu_;
  std::map<std::pair<DType, int64_t>, std::unique_ptr<Plan>> plans_ ABSL_GUARDED_BY(mu_);
};

Plans& AllPlans() {
  static Plans* plans = new Plans;
  return *plans;
}

// A packed matrix's oneDNN side: its plan and a memory object per slice, made at load so that
// nothing is created (or zero-padded) while it is multiplied.
struct Packed {
  const Plan* plan = nullptr;
  std::vector<memory> slices;
};

const Packed& PackedOf(const WeightMatrix& w) {
  TANDEM_CHECK(w.layout == WeightLayout::kOnednn && w.onednn != nullptr,
               "a kOnednn matrix without its oneDNN state");
  return *static_cast<const Packed*>(w.onednn);
}

// Tests: run every call on the 16-row primitive, as a row count that failed its plan's check
// does.
std::atomic<bool> pad_all{false};
// Benchmarks: pairs off.
std::atomic<bool> pair_chunks{true};

// One thread's memory objects for the primitives it has run: [plan id][rows].
struct ThreadCalls {
  struct Call {
    memory x, y, scratchpad;
    std::vector<char> scratch;
  };
  dnnl::stream stream{Engine()};
  std::vector<std::array<std::unique_ptr<Call>, kChunk + 1>> calls;
  alignas(kAlign) float y[2 * kChunk * kSlice];
  std::vector<char> padded;  // x rows padded to kChunk
  std::vector<float> rows;   // a slice unpacked by ReadOnednnRow
  std::vector<memory> rows_memory;  // [plan id]: over `rows`

  Call& For(const Plan& p, int64_t rows) {
    if (static_cast<int64_t>(calls.size()) <= p.id) calls.resize(p.id + 1);
    std::unique_ptr<Call>& c = calls[p.id][rows];
    if (c == nullptr) {
      c = std::make_unique<Call>();
      const memory::desc& scratch_desc = p.scratchpads[rows];
      c->scratch.resize(scratch_desc.get_size() + 1);
      c->x = Wrap(XDesc(p, rows), nullptr);
      c->y = Wrap(YDesc(rows), y);
      c->scratchpad = Wrap(scratch_desc, c->scratch.data());
    }
    return *c;
  }
};

ThreadCalls& Calls() {
  SingleThreaded();
  thread_local ThreadCalls calls;
  return calls;
}

// y[0, rows) x [n0, n1) = a call's result [rows][kSlice] (+ bias).
void CopyOut(const float* result, int64_t rows, const float* bias, float* y, int64_t y_stride,
             int64_t n0, int64_t n1) {
  for (int64_t i = 0; i < rows; ++i) {
    float* out = y + i * y_stride;
    const float* in = result + i * kSlice;
    for (int64_t n = n0; n < n1; ++n) out[n] = in[n - n0] + (bias ? bias[n] : 0.0f);
  }
}

const char* SliceData(const Packed& w, int64_t s) {
  return static_cast<const char*>(w.slices[s].get_data_handle());
}

// Whether a call on a slice of `o` writes y straight from the tiles (no bias, a whole slice), so
// that it may run a range of K blocks.
bool Straight(const GemmOutput& o, int64_t n0, int64_t n1) {
  return o.bias == nullptr && n1 - n0 == kSlice;
}

// y[0, rows) x [n0, n1) (+ bias) = kChunk < rows <= 2 * kChunk rows of x in the tile layout
// times slice `s` of `w`, whose first output row is n0 (a plan with pairs), over K blocks `kbs`
// (the whole of K unless Straight), asking for `ahead` into L2 while it runs.
void RunPair(const Packed& w, int64_t s, const char* x, int64_t rows, KBlocks kbs, Ahead ahead,
             const GemmOutput& o, int64_t y_row, int64_t n0, int64_t n1) {
  const int64_t k = w.plan->k;
  const TileX x0 = TileLayoutX(x), x1 = TileLayoutX(x + kChunk * k * 2);
  float* y = o.y + y_row * o.y_stride;
  if (Straight(o, n0, n1)) {
    TilePair(x0, x1, rows - kChunk, kbs, SliceData(w, s), y + n0, o.y_stride, ahead);
    return;
  }
  TANDEM_CHECK(kbs.begin == 0 && kbs.end == k / kTileK, "a range of K through the scratch rows");
  ThreadCalls& t = Calls();
  TilePair(x0, x1, rows - kChunk, kbs, SliceData(w, s), t.y, kSlice, ahead);
  CopyOut(t.y, rows, o.bias, y, o.y_stride, n0, n1);
}

// y[0, rows) x [n0, n1) (+ bias) = x's `rows` rows (contiguous, the plan's dtype; in the tile
// layout if `tile_x`) times slice `s` of `w`, whose first output row is n0, over K blocks `kbs`
// (the whole of K unless on the tiles and Straight).
void RunChunk(const Packed& w, int64_t s, const char* x, bool tile_x, int64_t rows, KBlocks kbs,
              const float* bias, float* y, int64_t y_stride, int64_t n0, int64_t n1) {
  const Plan& p = *w.plan;
  ThreadCalls& t = Calls();
  const bool pad = pad_all.load(std::memory_order_relaxed);
  const bool all_of_k = kbs.begin == 0 && kbs.end == p.k / kTileK;
  if (p.tiles[rows] && !pad) {
    const TileX tx = tile_x ? TileLayoutX(x) : RowMajor(reinterpret_cast<const uint16_t*>(x), p.k);
    if (bias == nullptr && n1 - n0 == kSlice) {  // straight into y
      TileRows(tx, rows, kbs, SliceData(w, s), y + n0, y_stride);
    } else {
      TANDEM_CHECK(all_of_k, "a range of K through the scratch rows");
      TileRows(tx, rows, kbs, SliceData(w, s), t.y, kSlice);
      CopyOut(t.y, rows, bias, y, y_stride, n0, n1);
    }
    return;
  }
  TANDEM_CHECK(all_of_k, "a range of K on a oneDNN primitive");
  const int64_t run = pad ? kChunk : p.run_rows[rows];
  if (run != rows) {
    const int64_t row_bytes = p.k * (p.dtype == DType::kBF16 ? 2 : 4);
    t.padded.resize(kChunk * row_bytes);
    std::memcpy(t.padded.data(), x, rows * row_bytes);
    std::memset(t.padded.data() + rows * row_bytes, 0, (kChunk - rows) * row_bytes);
    x = t.padded.data();
  }
  ThreadCalls::Call& c = t.For(p, run);
  c.x.set_data_handle(const_cast<char*>(x));
  const dnnl_exec_arg_t args[] = {{DNNL_ARG_SRC, c.x.get()},
                                  {DNNL_ARG_WEIGHTS, w.slices[s].get()},
                                  {DNNL_ARG_DST, c.y.get()},
                                  {DNNL_ARG_SCRATCHPAD, c.scratchpad.get()}};
  const dnnl_status_t status =
      dnnl_primitive_execute(p.by_rows[run].get(), t.stream.get(), 4, args);
  TANDEM_CHECK(status == dnnl_success, "oneDNN matmul failed on a shape its plan checked");
  CopyOut(t.y, rows, bias, y, y_stride, n0, n1);
}

// A block of x's rows (in the tile layout) over a range of K: at most this many bytes, so that
// it stays in a core's L2 (2 MiB on the Xeons with AMX) while every slice runs over it, beside
// the slice being read and the one being asked for. Row blocks of all of x measured 0.90 TFLOP/s
// on one core at 512 x 2048 x 2048, blocks of 1 MiB 1.08 and with the next slice asked into L2
// 1.20 (docs/benchmarks.md): a tile load from L3 waits, one from L2 mostly does not.
constexpr int64_t kBlockXBytes = int64_t{1} << 20;
std::atomic<int64_t> block_x_bytes{kBlockXBytes};  // tests: smaller
// K blocks per range where the outputs take ranges (Straight): 64 blocks (2,048 columns) keep a
// block of 256 rows within kBlockXBytes, so the weights are read from memory twice for a 512-row
// prefill, where all of K at once would leave blocks of 64 rows at K = 8,192 (eight reads).
constexpr int64_t kRangeBlocks = 64;
std::atomic<int64_t> range_blocks{kRangeBlocks};  // tests: shorter

// Calls of more than one chunk of rows on the tiles (prefill, and decode steps of 17-32 rows): x
// in the tile layout at `xs`. Ranges of K in turn (each output's sums carried in y from one to
// the next); in each, items of (block of rows, slice) with the blocks outermost
// (ForEachRowBlockSlice); each item asks for the next item's slice into L2 while it runs. A
// decode step's slices come from memory: asking for the next slice while one runs measured 1.08x
// the 32-row GEMM at 8,192 x 2,048 against asking 128 KiB ahead within the call, as before, and
// 1.03-1.05x the 1B batch-32 decode in 2 of 3 rounds. Every output still sums over K in order in
// its own tile: the bits do not change.
void RunTileBlocks(std::span<const GemmOutput> outputs, const char* xs, int64_t m, int64_t k,
                   ThreadPool& pool) {
  const int64_t blocks = k / kTileK, row_bytes = k * 2, unit = 2 * kChunk;
  const int64_t x_bytes = block_x_bytes.load(std::memory_order_relaxed);
  const int64_t most_blocks = range_blocks.load(std::memory_order_relaxed);
  bool straight = true;
  for (const GemmOutput& o : outputs) {
    straight = straight && o.bias == nullptr && o.w.rows % kSlice == 0;
  }
  const int64_t ranges = straight ? (blocks + most_blocks - 1) / most_blocks : 1;
  for (int64_t range = 0; range < ranges; ++range) {
    const KBlocks kbs{range * blocks / ranges, (range + 1) * blocks / ranges};
    const int64_t range_bytes = (kbs.end - kbs.begin) * kTileBlockBytes;
    // All of x in one block where a range would be longer than kRangeBlocks: smaller blocks would
    // read the weights from memory more often than they save.
    const int64_t block_rows = kbs.end - kbs.begin <= most_blocks
                                   ? x_bytes / ((kbs.end - kbs.begin) * kTileK * 2)
                                   : RoundUp(m, unit);
    internal::ForEachRowBlockSlice(
        outputs, m, kSlice, unit, block_rows, pool,
        [&](const GemmOutput& o, int64_t s, int64_t r0, int64_t r1, const GemmOutput& next,
            int64_t next_slice) {
          const int64_t n0 = s * kSlice, n1 = std::min(o.w.rows, n0 + kSlice);
          const Packed& w = PackedOf(o.w);
          const char* ahead = SliceData(PackedOf(next.w), next_slice) + kbs.begin * kTileBlockBytes;
          const int64_t calls = (r1 - r0 + unit - 1) / unit;
          for (int64_t c = 0; c < calls; ++c) {
            const int64_t row = r0 + c * unit, rows = std::min(unit, r1 - row);
            if (rows <= kChunk) {
              RunChunk(w, s, xs + row * row_bytes, true, rows, kbs, o.bias, o.y + row * o.y_stride,
                       o.y_stride, n0, n1);
              continue;
            }
            const int64_t b0 = range_bytes * c / calls, b1 = range_bytes * (c + 1) / calls;
            RunPair(w, s, xs + row * row_bytes, rows, kbs, {ahead + b0, b1 - b0}, o, row, n0, n1);
          }
        });
  }
}

}  // namespace

absl::StatusOr<CpuGemm> ParseCpuGemm(std::string_view name) {
  if (name == "auto") return CpuGemm::kAuto;
  if (name == "tandem") return CpuGemm::kTandem;
  if (name == "onednn") return CpuGemm::kOnednn;
  return absl::InvalidArgumentError(absl::StrCat(
      "model.cpu_gemm must be auto, tandem or onednn, got \"", std::string(name), "\""));
}

std::string_view CpuGemmName(CpuGemm gemm) {
  switch (gemm) {
    case CpuGemm::kAuto:
      return "auto";
    case CpuGemm::kTandem:
      return "tandem";
    case CpuGemm::kOnednn:
      return "onednn";
  }
  return "?";
}

const OnednnCpu& OnednnCpuInfo() {
  static const OnednnCpu* info = [] {
    auto* i = new OnednnCpu;
    switch (dnnl::get_effective_cpu_isa()) {
      case dnnl::cpu_isa::sse41:
        i->isa = "sse41";
        break;
      case dnnl::cpu_isa::avx:
        i->isa = "avx";
        break;
      case dnnl::cpu_isa::avx2:
        i->isa = "avx2";
        break;
      case dnnl::cpu_isa::avx2_vnni:
        i->isa = "avx2_vnni";
        break;
      case dnnl::cpu_isa::avx512_core:
        i->isa = "avx512_core";
        break;
      case dnnl::cpu_isa::avx512_core_vnni:
        i->isa = "avx512_core_vnni";
        break;
      case dnnl::cpu_isa::avx512_core_bf16:
        i->isa = "avx512_core_bf16";
        i->bf16 = true;
        break;
      case dnnl::cpu_isa::avx512_core_amx:
        i->isa = "avx512_core_amx";
        i->bf16 = i->amx = true;
        break;
      default:
        i->isa = "other";
        break;
    }
    return i;
  }();
  return *info;
}

DType OnednnPackDType(DType weights) {
  if (weights != DType::kF16) return weights;
  return OnednnCpuInfo().bf16 ? DType::kBF16 : DType::kF32;
}

namespace {

// What f16 weights become for oneDNN, for the choice's reason ("" for other dtypes).
std::string F16Conversion(DType dtype) {
  if (dtype != DType::kF16) return "";
  return OnednnPackDType(dtype) == DType::kBF16 ? "f16 weights rounded to bf16, "
                                                : "f16 weights widened to f32, ";
}

}  // namespace

absl::StatusOr<CpuGemmChoice> ChooseCpuGemm(CpuGemm requested, DType dtype) {
  const OnednnCpu& cpu = OnednnCpuInfo();
  const bool supported = dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16;
  switch (requested) {
    case CpuGemm::kTandem:
      return CpuGemmChoice{CpuGemm::kTandem, "tandem (requested)"};
    case CpuGemm::kOnednn:
      if (!supported) {
        return absl::InvalidArgumentError(
            absl::StrCat("model.cpu_gemm: onednn multiplies f32, bf16 and f16 weights, not ",
                         std::string(DTypeName(dtype))));
      }
      return CpuGemmChoice{
          CpuGemm::kOnednn,
          absl::StrCat("onednn (requested; ", F16Conversion(dtype), "oneDNN ISA ", cpu.isa, ")")};
    case CpuGemm::kAuto:
      break;
  }
  // Measured (docs/benchmarks.md): with bf16 dot products in hardware oneDNN's bf16 matmul
  // prefills 2.3-3.4x and decodes batches 1.7-2.6x as fast as the own kernels, batch 1 alike.
  // f16 weights go the same way rounded to bf16, as vLLM's CPU backend casts them.
  if (cpu.bf16 && (dtype == DType::kBF16 || dtype == DType::kF16)) {
    return CpuGemmChoice{
        CpuGemm::kOnednn,
        absl::StrCat(
            "onednn (auto: ", dtype == DType::kF16 ? F16Conversion(dtype) : "bf16 weights, ",
            "bf16 dot products in hardware; oneDNN ISA ", cpu.isa, ")")};
  }
  return CpuGemmChoice{
      CpuGemm::kTandem,
      absl::StrCat("tandem (auto: ",
                   cpu.bf16 ? absl::StrCat(std::string(DTypeName(dtype)), " weights")
                            : std::string("no bf16 dot products in hardware"),
                   "; oneDNN ISA ", cpu.isa, ")")};
}

absl::StatusOr<int64_t> OnednnBytes(DType dtype, int64_t rows, int64_t cols) {
  auto plan = AllPlans().Get(OnednnPackDType(dtype), cols);
  if (!plan.ok()) return plan.status();
  return (rows + kSlice - 1) / kSlice * (*plan)->slice_bytes;
}

absl::StatusOr<OnednnMatrix> PackOnednn(const WeightMatrix& w, void* out, ThreadPool& pool) {
  if (w.layout != WeightLayout::kRowMajor) {
    return absl::InvalidArgumentError("model.cpu_gemm: onednn packs row-major weights");
  }
  auto plan = AllPlans().Get(OnednnPackDType(w.dtype), w.cols);
  if (!plan.ok()) return plan.status();
  const Plan& p = **plan;
  auto packed = std::make_shared<Packed>();
  packed->plan = &p;
  const int64_t slices = (w.rows + kSlice - 1) / kSlice;
  const int64_t row_bytes = w.cols * static_cast<int64_t>(DTypeSize(w.dtype));
  const int64_t plan_row_bytes = w.cols * static_cast<int64_t>(DTypeSize(p.dtype));
  char* base = static_cast<char*>(out);
  for (int64_t s = 0; s < slices; ++s) {
    packed->slices.push_back(Wrap(p.weights, base + s * p.slice_bytes));
  }
  pool.ParallelFor(slices, 1, [&](int64_t s0, int64_t s1) {
    std::vector<char> tail;
    std::vector<float> widened(w.dtype != p.dtype ? w.cols : 0);
    for (int64_t s = s0; s < s1; ++s) {
      const int64_t n0 = s * kSlice, n = std::min(kSlice, w.rows - n0);
      const char* rows = static_cast<const char*>(w.data) + n0 * row_bytes;
      if (w.dtype != p.dtype) {  // f16: each row to f32 (exact), then to the plan's dtype
        tail.assign(kSlice * plan_row_bytes, 0);
        for (int64_t r = 0; r < n; ++r) {
          ToFloat(w.dtype, rows + r * row_bytes, widened.data(), w.cols);
          FromFloat(p.dtype, widened.data(), tail.data() + r * plan_row_bytes, w.cols);
        }
        rows = tail.data();
      } else if (n < kSlice) {  // the last slice's missing rows are zeros
        tail.assign(kSlice * row_bytes, 0);
        std::memcpy(tail.data(), rows, n * row_bytes);
        rows = tail.data();
      }
      SingleThreaded();
      PackSlice(p, rows, base + s * p.slice_bytes);
    }
  });
  WeightMatrix view = w;
  view.dtype = p.dtype;
  view.data = out;
  view.layout = WeightLayout::kOnednn;
  view.onednn = packed.get();
  return OnednnMatrix{view, std::move(packed)};
}

std::string OnednnImplementation(const WeightMatrix& w) {
  const Plan& p = *PackedOf(w).plan;
  return p.padding.empty() ? p.impl : absl::StrCat(p.impl, " (", p.padding, ")");
}

namespace internal {

void GemmOnednn(const float* x, int64_t m, int64_t x_stride, std::span<const GemmOutput> outputs,
                ThreadPool& pool) {
  if (m <= 0 || outputs.empty()) return;
  const Plan& plan = *PackedOf(outputs.front().w).plan;
  const int64_t k = plan.k;
  // With pairs, x in the tile layout: per chunk of kChunk rows, per K block, kChunk x kTileK
  // values (1 KiB), so that each tile load reads one piece of memory. Not for a single chunk,
  // which gains nothing from it: a few rows' blocks 1 KiB apart would share 4 of L1's 64 sets.
  const bool tile_x = plan.pairs && m > kChunk && !pad_all.load(std::memory_order_relaxed) &&
                      pair_chunks.load(std::memory_order_relaxed);
  // x as the primitives read it: rows of k values in the weights' dtype, one after another
  // (or the tile layout). Owned by the calling thread; the workers get the pointer.
  thread_local std::vector<char> x_buffer;
  const char* xs = reinterpret_cast<const char*>(x);
  const int64_t row_bytes = k * (plan.dtype == DType::kBF16 ? 2 : 4);
  if (plan.dtype == DType::kBF16 || x_stride != k) {
    // At a cache line: a tile row that straddles two lines reads both (measured: 13% of a tile
    // GEMM's time on one core; vector's own start is 16 bytes past a page).
    const int64_t bytes = RoundUp(m, kChunk) * row_bytes;
    if (static_cast<int64_t>(x_buffer.size()) < bytes + kAlign) x_buffer.resize(bytes + kAlign);
    char* dst =
        reinterpret_cast<char*>(RoundUp(reinterpret_cast<intptr_t>(x_buffer.data()), kAlign));
    auto convert = [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        if (!tile_x) {
          FromFloat(plan.dtype, x + r * x_stride, dst + r * row_bytes, k);
          continue;
        }
        char* row = dst + r / kChunk * kChunk * row_bytes + r % kChunk * kTileK * 2;
        for (int64_t kb = 0; kb < k / kTileK; ++kb) {
          FromFloat(plan.dtype, x + r * x_stride + kb * kTileK, row + kb * kTileXBlockBytes,
                    kTileK);
        }
      }
    };
    constexpr int64_t kGrain = 32;  // a decode step's few rows are not worth waking the pool
    if (m <= kGrain) {
      convert(0, m);
    } else {
      pool.ParallelFor(m, kGrain, convert);
    }
    xs = dst;
  }
  if (tile_x) {
    RunTileBlocks(outputs, xs, m, k, pool);
    return;
  }
  // Work items: (slice of one output, part of the rows), one chunk a call.
  ForEachSlice(outputs, m, kSlice, kChunk, 1, /*split_rows=*/true, pool,
               [&](const GemmOutput& o, int64_t s, int64_t r0, int64_t r_end) {
                 const Packed& w = PackedOf(o.w);
                 const int64_t n0 = s * kSlice, n1 = std::min(o.w.rows, n0 + kSlice);
                 for (; r0 < r_end; r0 += kChunk) {
                   RunChunk(w, s, xs + r0 * row_bytes, false, std::min(kChunk, r_end - r0),
                            AllOf(k), o.bias, o.y + r0 * o.y_stride, o.y_stride, n0, n1);
                 }
               });
}

void PadOnednnCalls(bool pad) { pad_all.store(pad); }

void PairOnednnChunks(bool pair) { pair_chunks.store(pair); }

void SetTileBlocking(int64_t x_bytes, int64_t k_blocks) {
  block_x_bytes.store(x_bytes > 0 ? x_bytes : kBlockXBytes);
  range_blocks.store(k_blocks > 0 ? k_blocks : kRangeBlocks);
}

std::string DescribeRowPadding(std::span<const int64_t, kOnednnChunkRows + 1> run_rows,
                               std::span<const std::string, kOnednnChunkRows + 1> impls) {
  std::string ranges, others;
  for (int64_t r = 1; r < kChunk; ++r) {
    if (run_rows[r] == r) continue;
    int64_t last = r;
    while (last + 1 < kChunk && run_rows[last + 1] != last + 1) ++last;
    absl::StrAppend(&ranges, ranges.empty() ? "" : ", ", r);
    if (last > r) absl::StrAppend(&ranges, "-", last);
    for (int64_t q = r; q <= last; ++q) {
      if (impls[q] != impls[kChunk] && impls[q] != "none" &&
          others.find(impls[q]) == std::string::npos) {
        absl::StrAppend(&others, others.empty() ? "" : ", ", impls[q]);
      }
    }
    r = last;
  }
  if (ranges.empty()) return "";
  return absl::StrCat(ranges, " rows run padded to ", kChunk,
                      others.empty() ? "" : absl::StrCat(": ", others, " gives other bits"));
}

void ReadOnednnRow(const WeightMatrix& w, int64_t row, float* out) {
  const Packed& packed = PackedOf(w);
  const Plan& p = *packed.plan;
  ThreadCalls& t = Calls();
  if (static_cast<int64_t>(t.rows.size()) < kSlice * p.k) {
    t.rows.resize(kSlice * p.k);
    t.rows_memory.clear();  // over the old buffer
  }
  if (static_cast<int64_t>(t.rows_memory.size()) <= p.id) t.rows_memory.resize(p.id + 1);
  memory& dst = t.rows_memory[p.id];
  if (!dst) dst = Wrap(RowsDesc(p.k), t.rows.data());
  const dnnl_exec_arg_t args[] = {{DNNL_ARG_FROM, packed.slices[row / kSlice].get()},
                                  {DNNL_ARG_TO, dst.get()}};
  const dnnl_status_t status = dnnl_primitive_execute(p.unpack.get(), t.stream.get(), 2, args);
  TANDEM_CHECK(status == dnnl_success, "oneDNN could not unpack a slice it packed");
  std::memcpy(out, t.rows.data() + row % kSlice * p.k, p.k * sizeof(float));
}

}  // namespace internal
}  // namespace tandem::kernels
