#include "common/kernels/cpu/onednn_gemm.h"

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
#include "common/util/check.h"
#include "oneapi/dnnl/dnnl.hpp"

// libgomp's, which oneDNN runs on (declared here: clang's omp.h would be another runtime's).
extern "C" void omp_set_num_threads(int num_threads);

namespace tandem::kernels {
namespace {

using dnnl::memory;
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
  std::string impl;
};

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
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Plan>> MakePlan(DType dtype, int64_t k) {
  if (dtype != DType::kF32 && dtype != DType::kBF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.cpu_gemm: onednn multiplies f32 and bf16 weights, not ",
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
    for (int64_t r = 1; r < kChunk; ++r) {
      p->run_rows[r] = kChunk;
      try {
        const dnnl::matmul::primitive_desc pd = Describe(*p, r, p->weights);
        p->by_rows[r] = dnnl::matmul(pd);
        p->scratchpads[r] = pd.scratchpad_desc();
        p->run_rows[r] = r;
      } catch (const dnnl::error&) {
        // No implementation reads the 16-row layout at r rows: r rows are padded to 16.
      }
    }
    if (absl::Status s = CheckInvariance(*p); !s.ok()) return s;
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

// One thread's memory objects for the primitives it has run: [plan id][rows].
struct ThreadCalls {
  struct Call {
    memory x, y, scratchpad;
    std::vector<char> scratch;
  };
  dnnl::stream stream{Engine()};
  std::vector<std::array<std::unique_ptr<Call>, kChunk + 1>> calls;
  alignas(kAlign) float y[kChunk * kSlice];
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

// y[0, rows) x [n0, n1) (+ bias) = x's `rows` rows (contiguous, the plan's dtype) times slice
// `s` of `w`, whose first output row is n0.
void RunChunk(const Packed& w, int64_t s, const char* x, int64_t rows, const float* bias, float* y,
              int64_t y_stride, int64_t n0, int64_t n1) {
  const Plan& p = *w.plan;
  ThreadCalls& t = Calls();
  const int64_t run = pad_all.load(std::memory_order_relaxed) ? kChunk : p.run_rows[rows];
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
  for (int64_t i = 0; i < rows; ++i) {
    float* out = y + i * y_stride;
    const float* in = t.y + i * kSlice;
    for (int64_t n = n0; n < n1; ++n) out[n] = in[n - n0] + (bias ? bias[n] : 0.0f);
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

absl::StatusOr<CpuGemmChoice> ChooseCpuGemm(CpuGemm requested, DType dtype) {
  const OnednnCpu& cpu = OnednnCpuInfo();
  const bool supported = dtype == DType::kF32 || dtype == DType::kBF16;
  switch (requested) {
    case CpuGemm::kTandem:
      return CpuGemmChoice{CpuGemm::kTandem, "tandem (requested)"};
    case CpuGemm::kOnednn:
      if (!supported) {
        return absl::InvalidArgumentError(
            absl::StrCat("model.cpu_gemm: onednn multiplies f32 and bf16 weights, not ",
                         std::string(DTypeName(dtype))));
      }
      return CpuGemmChoice{CpuGemm::kOnednn,
                           absl::StrCat("onednn (requested; oneDNN ISA ", cpu.isa, ")")};
    case CpuGemm::kAuto:
      break;
  }
  // Measured (docs/benchmarks.md): with bf16 dot products in hardware oneDNN's bf16 matmul
  // prefills 2.3-3.4x and decodes batches 1.7-2.6x as fast as the own kernels, batch 1 alike.
  if (cpu.bf16 && dtype == DType::kBF16) {
    return CpuGemmChoice{
        CpuGemm::kOnednn,
        absl::StrCat("onednn (auto: bf16 weights, bf16 dot products in hardware; oneDNN ISA ",
                     cpu.isa, ")")};
  }
  return CpuGemmChoice{
      CpuGemm::kTandem,
      absl::StrCat("tandem (auto: ",
                   cpu.bf16 ? absl::StrCat(std::string(DTypeName(dtype)), " weights")
                            : std::string("no bf16 dot products in hardware"),
                   "; oneDNN ISA ", cpu.isa, ")")};
}

absl::StatusOr<int64_t> OnednnBytes(DType dtype, int64_t rows, int64_t cols) {
  auto plan = AllPlans().Get(dtype, cols);
  if (!plan.ok()) return plan.status();
  return (rows + kSlice - 1) / kSlice * (*plan)->slice_bytes;
}

absl::StatusOr<OnednnMatrix> PackOnednn(const WeightMatrix& w, void* out, ThreadPool& pool) {
  if (w.layout != WeightLayout::kRowMajor) {
    return absl::InvalidArgumentError("model.cpu_gemm: onednn packs row-major weights");
  }
  auto plan = AllPlans().Get(w.dtype, w.cols);
  if (!plan.ok()) return plan.status();
  const Plan& p = **plan;
  auto packed = std::make_shared<Packed>();
  packed->plan = &p;
  const int64_t slices = (w.rows + kSlice - 1) / kSlice;
  const int64_t row_bytes = w.cols * static_cast<int64_t>(DTypeSize(w.dtype));
  char* base = static_cast<char*>(out);
  for (int64_t s = 0; s < slices; ++s) {
    packed->slices.push_back(Wrap(p.weights, base + s * p.slice_bytes));
  }
  pool.ParallelFor(slices, 1, [&](int64_t s0, int64_t s1) {
    std::vector<char> tail;
    for (int64_t s = s0; s < s1; ++s) {
      const int64_t n0 = s * kSlice, n = std::min(kSlice, w.rows - n0);
      const char* rows = static_cast<const char*>(w.data) + n0 * row_bytes;
      if (n < kSlice) {  // the last slice's missing rows are zeros
        tail.assign(kSlice * row_bytes, 0);
        std::memcpy(tail.data(), rows, n * row_bytes);
        rows = tail.data();
      }
      SingleThreaded();
      PackSlice(p, rows, base + s * p.slice_bytes);
    }
  });
  WeightMatrix view = w;
  view.data = out;
  view.layout = WeightLayout::kOnednn;
  view.onednn = packed.get();
  return OnednnMatrix{view, std::move(packed)};
}

std::string OnednnImplementation(const WeightMatrix& w) { return PackedOf(w).plan->impl; }

namespace internal {

void GemmOnednn(const float* x, int64_t m, int64_t x_stride, std::span<const GemmOutput> outputs,
                ThreadPool& pool) {
  if (m <= 0 || outputs.empty()) return;
  const Plan& plan = *PackedOf(outputs.front().w).plan;
  const int64_t k = plan.k;
  // x as the primitives read it: rows of k values in the weights' dtype, one after another.
  // Owned by the calling thread; the workers get the pointer.
  thread_local std::vector<char> x_buffer;
  const char* xs = reinterpret_cast<const char*>(x);
  const int64_t row_bytes = k * (plan.dtype == DType::kBF16 ? 2 : 4);
  if (plan.dtype == DType::kBF16 || x_stride != k) {
    if (static_cast<int64_t>(x_buffer.size()) < m * row_bytes) x_buffer.resize(m * row_bytes);
    char* dst = x_buffer.data();
    auto convert = [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        FromFloat(plan.dtype, x + r * x_stride, dst + r * row_bytes, k);
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
  // Work items: (slice of one output, part of the rows); rows are split only when there are
  // too few slices to keep every thread busy.
  int64_t slices = 0;
  for (const auto& o : outputs) slices += (o.w.rows + kSlice - 1) / kSlice;
  const int64_t chunks = (m + kChunk - 1) / kChunk;
  const int64_t threads = pool.num_threads();
  const int64_t parts = slices >= 2 * threads
                            ? 1
                            : std::clamp<int64_t>((2 * threads + slices - 1) / slices, 1, chunks);
  const int64_t chunks_per_part = (chunks + parts - 1) / parts;
  pool.ParallelForDynamic(slices * parts, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      int64_t s = t / parts;
      const int64_t part = t % parts;
      for (const auto& o : outputs) {
        const int64_t count = (o.w.rows + kSlice - 1) / kSlice;
        if (s >= count) {
          s -= count;
          continue;
        }
        const Packed& w = PackedOf(o.w);
        const int64_t n0 = s * kSlice, n1 = std::min(o.w.rows, n0 + kSlice);
        const int64_t r_end = std::min(m, (part + 1) * chunks_per_part * kChunk);
        for (int64_t r0 = part * chunks_per_part * kChunk; r0 < r_end; r0 += kChunk) {
          RunChunk(w, s, xs + r0 * row_bytes, std::min(kChunk, r_end - r0), o.bias,
                   o.y + r0 * o.y_stride, o.y_stride, n0, n1);
        }
        break;
      }
    }
  });
}

void PadOnednnCalls(bool pad) { pad_all.store(pad); }

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
