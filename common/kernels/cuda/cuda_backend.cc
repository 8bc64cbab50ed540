#include "common/kernels/cuda/cuda_backend.h"

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/kernels/cuda/cublaslt_loader.h"
#include "common/kernels/cuda/cuda_kernels.h"

namespace tandem::kernels {
namespace {

using cuda::SequenceDesc;

std::string CudaError(cudaError_t e) {
  return absl::StrCat(cudaGetErrorName(e), ": ", cudaGetErrorString(e));
}

absl::Status CudaStatus(cudaError_t e, const char* what, int ordinal) {
  return absl::FailedPreconditionError(
      absl::StrCat("cuda:", ordinal, ": ", what, ": ", CudaError(e)));
}

// Returns FailedPrecondition from the enclosing function when `expr` fails.
#define TANDEM_CUDA_RETURN(expr, what)                                        \
  do {                                                                        \
    const cudaError_t tandem_e = (expr);                                      \
    if (tandem_e != cudaSuccess) return CudaStatus(tandem_e, what, ordinal_); \
  } while (0)

double GiB(size_t bytes) { return static_cast<double>(bytes) / (1 << 30); }

cudaDataType_t CudaType(DType t) {
  switch (t) {
    case DType::kF16:
      return CUDA_R_16F;
    case DType::kBF16:
      return CUDA_R_16BF;
    default:
      return CUDA_R_32F;
  }
}

// Host metadata of the current step (token ids, positions, block tables, sequence
// descriptors), staged in pinned memory and copied to the device on the stream. Every slice
// handed out stays valid until Reset, which the backend calls only after the stream has
// drained: a buffer outgrown mid-step is retired, not freed, since work queued earlier in the
// step may still read it.
class Staging {
 public:
  ~Staging() {
    Reset();
    Release(host_, device_);
  }

  // The device copy of `bytes` bytes at `src`, or null if memory ran out (then the backend
  // reports the error at Finish).
  void* Put(const void* src, size_t bytes, cudaStream_t stream, cudaError_t* error) {
    size_t at = (used_ + 255) / 256 * 256;
    if (at + bytes > capacity_) {
      if (host_ != nullptr) retired_.emplace_back(host_, device_);
      host_ = device_ = nullptr;
      const size_t want = std::max(capacity_ * 2, bytes + (1 << 20));
      capacity_ = used_ = at = 0;
      cudaError_t e = cudaMallocHost(&host_, want);
      if (e == cudaSuccess) e = cudaMalloc(&device_, want);
      if (e != cudaSuccess) {
        *error = e;
        Release(host_, device_);
        host_ = device_ = nullptr;
        return nullptr;
      }
      capacity_ = want;
    }
    std::memcpy(static_cast<char*>(host_) + at, src, bytes);
    void* dst = static_cast<char*>(device_) + at;
    const cudaError_t e =
        cudaMemcpyAsync(dst, static_cast<char*>(host_) + at, bytes, cudaMemcpyHostToDevice, stream);
    if (e != cudaSuccess) *error = e;
    used_ = at + bytes;
    return dst;
  }
  // Call only once the stream has drained.
  void Reset() {
    used_ = 0;
    for (auto [host, device] : retired_) Release(host, device);
    retired_.clear();
  }

 private:
  static void Release(void* host, void* device) {
    if (host != nullptr) cudaFreeHost(host);
    if (device != nullptr) cudaFree(device);
  }

  void* host_ = nullptr;
  void* device_ = nullptr;
  size_t capacity_ = 0;
  size_t used_ = 0;
  std::vector<std::pair<void*, void*>> retired_;  // outgrown buffers, freed at Reset
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(int ordinal, std::string name, size_t total_bytes, const cuda::CublasLt& api)
      : ordinal_(ordinal), name_(std::move(name)), total_bytes_(total_bytes), api_(&api) {}

  ~CudaBackend() override {
    cudaSetDevice(ordinal_);
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);
    for (auto& [host, device] : resident_) cudaFree(device);
    if (workspace_ != nullptr) cudaFree(workspace_);
    if (convert_ != nullptr) cudaFree(convert_);
    for (auto& [key, plan] : plans_) plan.Destroy(*api_);
    if (lt_ != nullptr) api_->Destroy(lt_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  absl::Status Init() {
    TANDEM_CUDA_RETURN(cudaSetDevice(ordinal_), "cudaSetDevice");
    TANDEM_CUDA_RETURN(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                       "cudaStreamCreate");
    if (api_->Create(&lt_) != CUBLAS_STATUS_SUCCESS) {
      return absl::FailedPreconditionError(
          absl::StrCat("cuda:", ordinal_, ": cublasLtCreate failed"));
    }
    TANDEM_CUDA_RETURN(cudaMalloc(&workspace_, kWorkspaceBytes), "cudaMalloc (GEMM workspace)");
    return absl::OkStatus();
  }

  std::string Describe() const override {
    return absl::StrFormat("cuda:%d (%s, %.0f GiB)", ordinal_, name_, GiB(total_bytes_));
  }
  bool host_addressable() const override { return false; }
  size_t resident_bytes() const override { return resident_bytes_; }

  absl::StatusOr<void*> Allocate(size_t bytes) override {
    Use();
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, std::max<size_t>(bytes, 1));
    if (e != cudaSuccess) {
      cudaGetLastError();  // an allocation failure is not sticky; clear it
      return OutOfMemory(bytes, e);
    }
    return p;
  }
  void Free(void* p) override {
    Use();
    cudaFree(p);
  }
  void Zero(void* p, size_t bytes) override {
    Use();
    Check(cudaMemsetAsync(p, 0, bytes, stream_));
  }

  absl::StatusOr<const void*> Resident(const void* host, size_t bytes) override {
    Use();
    auto it = resident_.find(host);
    if (it != resident_.end()) return it->second;  // tied embeddings are uploaded once
    absl::StatusOr<void*> p = Allocate(bytes);
    if (!p.ok()) return p.status();
    const cudaError_t e = cudaMemcpy(*p, host, bytes, cudaMemcpyHostToDevice);
    if (e != cudaSuccess) {
      cudaFree(*p);
      return absl::InternalError(
          absl::StrCat("copying weights to cuda:", ordinal_, ": ", CudaError(e)));
    }
    resident_.emplace(host, *p);
    resident_bytes_ += bytes;
    return *p;
  }

  absl::StatusOr<WeightMatrix> ResidentWeight(const WeightMatrix& host) override {
    if (host.layout != WeightLayout::kRowMajor) {
      return absl::InvalidArgumentError(
          "the CUDA backend reads row-major weights; load them with model.weight_memory mmap");
    }
    if (host.dtype == DType::kI8) return absl::InvalidArgumentError("int8 weights are KV only");
    WeightMatrix w = host;
    absl::StatusOr<const void*> p =
        Resident(host.data, static_cast<size_t>(host.rows * host.cols) * DTypeSize(host.dtype));
    if (!p.ok()) return p.status();
    w.data = *p;
    return w;
  }

  void CopyToHost(void* host_dst, const void* src, size_t bytes) override {
    Use();
    Check(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
    Drain();
  }
  void CopyFromHost(void* dst, const void* host_src, size_t bytes) override {
    Use();
    Check(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream_));
    Drain();
  }

  absl::Status Finish() override {
    Use();
    Drain();
    Check(cudaGetLastError());
    absl::Status s = error_;
    error_ = absl::OkStatus();
    return s;
  }

  void Embed(const WeightMatrix& table, const int32_t* host_tokens, int64_t n,
             float* out) override {
    Use();
    const auto* tokens = static_cast<const int32_t*>(Stage(host_tokens, n * sizeof(int32_t)));
    cuda::LaunchEmbed(table.data, table.dtype, table.cols, tokens, n, out, stream_);
  }
  void RmsNorm(const float* x, const float* weight, float eps, int64_t rows, int64_t dim,
               float* y) override {
    Use();
    cuda::LaunchRmsNorm(x, weight, eps, rows, dim, y, stream_);
  }
  void GemmMulti(const float* x, int64_t m, int64_t x_stride,
                 std::span<const GemmOutput> outputs) override {
    Use();
    if (outputs.empty() || m <= 0) return;
    const DType dtype = outputs.front().w.dtype;
    const void* b = ConvertInput(x, m, outputs.front().w.cols, x_stride, dtype);
    for (const GemmOutput& o : outputs) {
      Matmul(b, o.w.dtype == DType::kF32 ? x_stride : o.w.cols, m, o);
    }
  }
  void Gemm(const float* x, int64_t m, int64_t x_stride, const WeightMatrix& w, const float* bias,
            float* y, int64_t y_stride) override {
    const GemmOutput out{w, bias, y, y_stride};
    GemmMulti(x, m, x_stride, std::span<const GemmOutput>(&out, 1));
  }
  void SiluMul(const float* gate_up, int64_t rows, int64_t dim, float* out) override {
    Use();
    cuda::LaunchSiluMul(gate_up, rows, dim, out, stream_);
  }
  void Add(float* y, const float* x, int64_t n) override {
    Use();
    cuda::LaunchAdd(y, x, n, stream_);
  }
  void Scale(float* x, float factor, int64_t n) override {
    Use();
    cuda::LaunchScale(x, factor, n, stream_);
  }
  void Rope(float* q, int q_heads, float* k, int k_heads, int head_dim, int64_t rows,
            const int64_t* host_positions, const float* inv_freq) override {
    Use();
    const auto* positions =
        static_cast<const int64_t*>(Stage(host_positions, rows * sizeof(int64_t)));
    cuda::LaunchRope(q, q_heads, k, k_heads, head_dim, rows, positions, inv_freq, stream_);
  }
  void GatherRows(const float* src, int64_t width, const int64_t* host_rows, int64_t n,
                  float* dst) override {
    Use();
    const auto* rows = static_cast<const int64_t*>(Stage(host_rows, n * sizeof(int64_t)));
    cuda::LaunchMoveRows(src, width, rows, n, dst, /*scatter=*/false, stream_);
  }
  void ScatterRows(const float* src, int64_t width, const int64_t* host_rows, int64_t n,
                   float* dst) override {
    Use();
    const auto* rows = static_cast<const int64_t*>(Stage(host_rows, n * sizeof(int64_t)));
    cuda::LaunchMoveRows(src, width, rows, n, dst, /*scatter=*/true, stream_);
  }

  void WriteKv(const float* k, const float* v, std::span<const KvWrite> writes,
               const kv::KvArena& kv, int layer) override {
    Use();
    const Step step = StageSequences(writes, kv.layout.block_size, [](const KvWrite& w) {
      return SequenceDesc{.row = w.row, .start_pos = w.start_pos, .num_tokens = w.num_tokens};
    });
    cuda::LaunchWriteKv(k, v, step.seqs, step.num_seqs, step.items, step.tables, cuda::PoolOf(kv),
                        layer, stream_);
  }

  void PagedAttention(std::span<const AttentionSequence> seqs, int num_heads, const kv::KvArena& kv,
                      int layer, float scale) override {
    Use();
    const Step step = StageSequences(seqs, kv.layout.block_size, [](const AttentionSequence& s) {
      return SequenceDesc{
          .q = s.q, .out = s.out, .start_pos = s.start_pos, .num_tokens = s.num_tokens};
    });
    cuda::LaunchPagedAttention(step.seqs, step.num_seqs, step.items, num_heads, step.tables,
                               cuda::PoolOf(kv), layer, scale, stream_);
  }

 private:
  static constexpr size_t kWorkspaceBytes = 32 << 20;

  // A cuBLASLt plan for one GEMM shape, reused across steps.
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool ok = false;
    void Destroy(const cuda::CublasLt& api) {
      if (desc != nullptr) api.MatmulDescDestroy(desc);
      if (a != nullptr) api.MatrixLayoutDestroy(a);
      if (b != nullptr) api.MatrixLayoutDestroy(b);
      if (d != nullptr) api.MatrixLayoutDestroy(d);
    }
  };
  // (dtype, m, n, k, ldb, ldd, bias)
  // (dtype, m, n, k, ldb, ldd, bias, alignment of the A, B and D pointers)
  using PlanKey = std::tuple<int, int64_t, int64_t, int64_t, int64_t, int64_t, bool, uint32_t,
                             uint32_t, uint32_t>;

  absl::Status OutOfMemory(size_t bytes, cudaError_t e) const {
    size_t free_bytes = 0, total = 0;
    cudaMemGetInfo(&free_bytes, &total);
    return absl::ResourceExhaustedError(absl::StrFormat(
        "cuda:%d: cannot allocate %.3f GiB (%s); %.3f GiB of %.3f GiB free, %.3f GiB of weights "
        "resident",
        ordinal_, GiB(bytes), CudaError(e), GiB(free_bytes), GiB(total), GiB(resident_bytes_)));
  }

  // Makes this backend's device current on the calling thread (the engine loop runs on another
  // thread than the one that created the backend).
  void Use() const {
    thread_local int current = -1;
    if (current != ordinal_) {
      cudaSetDevice(ordinal_);
      current = ordinal_;
    }
  }

  // Remembers the first failure of an operation; Finish reports it.
  void Check(cudaError_t e) {
    if (e != cudaSuccess && error_.ok()) {
      error_ = absl::InternalError(absl::StrCat("cuda:", ordinal_, ": ", CudaError(e)));
    }
  }
  void Drain() {
    Check(cudaStreamSynchronize(stream_));
    staging_.Reset();
  }

  const void* Stage(const void* host, size_t bytes) {
    cudaError_t e = cudaSuccess;
    void* p = staging_.Put(host, bytes, stream_, &e);
    Check(e);
    return p;
  }

  // Appends the blocks covering positions [0, end) of `table`; returns where they start.
  int AppendTable(const int32_t* table, int64_t end, int block_size) {
    const int offset = static_cast<int>(tables_.size());
    const int64_t blocks = (end + block_size - 1) / block_size;
    tables_.insert(tables_.end(), table, table + blocks);
    return offset;
  }

  // One launch's sequences on the device: descriptors, block tables, and the token count.
  struct Step {
    const SequenceDesc* seqs;
    int num_seqs;
    int64_t items;
    const int32_t* tables;
  };
  // Describes each of `in` (`describe` fills what is its own; the running item count and its
  // block table's place are filled here) and stages the lot.
  template <typename T, typename Describe>
  Step StageSequences(std::span<const T> in, int block_size, Describe describe) {
    descs_.clear();
    tables_.clear();
    int64_t items = 0;
    for (const T& s : in) {
      SequenceDesc d = describe(s);
      d.first_item = items;
      d.table_offset = AppendTable(s.block_table, s.start_pos + s.num_tokens, block_size);
      descs_.push_back(d);
      items += s.num_tokens;
    }
    const auto* seqs = static_cast<const SequenceDesc*>(
        Stage(descs_.data(), descs_.size() * sizeof(SequenceDesc)));
    const auto* tables = static_cast<const int32_t*>(
        Stage(tables_.data(), std::max<size_t>(tables_.size(), 1) * sizeof(int32_t)));
    return {seqs, static_cast<int>(descs_.size()), items, tables};
  }

  // x as the GEMM's B operand: f32 weights read x in place; f16/bf16 weights get x converted
  // to their type (dense, ld = k) in a reused buffer.
  const void* ConvertInput(const float* x, int64_t m, int64_t k, int64_t x_stride, DType dtype) {
    if (dtype == DType::kF32) return x;
    const size_t bytes = static_cast<size_t>(m * k) * 2;
    if (bytes > convert_bytes_) {
      Drain();
      if (convert_ != nullptr) cudaFree(convert_);
      convert_ = nullptr;
      convert_bytes_ = 0;
      absl::StatusOr<void*> p = Allocate(bytes);
      if (!p.ok()) {
        if (error_.ok()) error_ = p.status();
        return nullptr;
      }
      convert_ = *p;
      convert_bytes_ = bytes;
    }
    cuda::LaunchConvertRows(x, m, k, x_stride, dtype, convert_, stream_);
    return convert_;
  }

  // y[m, n] = x[m, k] w[n, k]^T (+ bias). cuBLASLt is column-major, so it computes
  // y^T [n, m] = w [k, n]^T . x^T [k, m], every matrix read in place.
  void Matmul(const void* b, int64_t ldb, int64_t m, const GemmOutput& o) {
    if (b == nullptr) return;  // the input conversion failed; error_ says why
    const int64_t n = o.w.rows, k = o.w.cols;
    // Algorithms may need aligned operands (a y at an odd column offset is not 16-byte
    // aligned), so plans are chosen for the alignment the pointers have.
    const uint32_t align_a = Alignment(o.w.data), align_b = Alignment(b), align_d = Alignment(o.y);
    const PlanKey key{static_cast<int>(o.w.dtype), m,       n,       k,      ldb, o.y_stride,
                      o.bias != nullptr,           align_a, align_b, align_d};
    auto it = plans_.find(key);
    if (it == plans_.end()) {
      it = plans_.emplace(key, MakePlan(o.w.dtype, m, n, k, ldb, o, {align_a, align_b, align_d}))
               .first;
    }
    Plan& plan = it->second;
    if (!plan.ok) {
      if (error_.ok()) {
        error_ = absl::InternalError(absl::StrCat("cuda:", ordinal_, ": no cuBLASLt algorithm for ",
                                                  m, "x", n, "x", k, " in ",
                                                  std::string(DTypeName(o.w.dtype))));
      }
      return;
    }
    if (o.bias != nullptr) {
      api_->MatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &o.bias,
                                   sizeof(o.bias));
    }
    const float alpha = 1.0f, beta = 0.0f;
    const cublasStatus_t s =
        api_->Matmul(lt_, plan.desc, &alpha, o.w.data, plan.a, b, plan.b, &beta, o.y, plan.d, o.y,
                     plan.d, &plan.algo, workspace_, kWorkspaceBytes, stream_);
    if (s != CUBLAS_STATUS_SUCCESS && error_.ok()) {
      error_ = absl::InternalError(
          absl::StrCat("cuda:", ordinal_, ": cublasLtMatmul failed (", static_cast<int>(s), ")"));
    }
  }

  // The largest power of two (at most 256) that divides the address.
  static uint32_t Alignment(const void* p) {
    const auto a = reinterpret_cast<uintptr_t>(p);
    return a == 0 ? 256u : static_cast<uint32_t>(std::min<uintptr_t>(a & -a, 256));
  }

  Plan MakePlan(DType dtype, int64_t m, int64_t n, int64_t k, int64_t ldb, const GemmOutput& o,
                std::array<uint32_t, 3> align) {
    Plan p;
    const cudaDataType_t ab = CudaType(dtype);
    if (api_->MatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS) {
      return p;
    }
    const cublasOperation_t trans = CUBLAS_OP_T, no_trans = CUBLAS_OP_N;
    api_->MatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans, sizeof(trans));
    api_->MatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &no_trans, sizeof(no_trans));
    if (o.bias != nullptr) {
      const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
      const cudaDataType_t bias_type = CUDA_R_32F;
      api_->MatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                   sizeof(epilogue));
      api_->MatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                   sizeof(bias_type));
      api_->MatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &o.bias,
                                   sizeof(o.bias));
    }
    // A = w as stored: [n rows, k cols] row-major = k x n column-major (ld k), transposed.
    api_->MatrixLayoutCreate(&p.a, ab, k, n, k);
    api_->MatrixLayoutCreate(&p.b, ab, k, m, ldb);
    api_->MatrixLayoutCreate(&p.d, CUDA_R_32F, n, m, o.y_stride);
    cublasLtMatmulPreference_t pref = nullptr;
    api_->MatmulPreferenceCreate(&pref);
    const size_t workspace = kWorkspaceBytes;
    api_->MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                       sizeof(workspace));
    for (auto [attribute, bytes] : {std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align[0]},
                                    {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align[1]},
                                    {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align[2]},
                                    {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align[2]}}) {
      api_->MatmulPreferenceSetAttribute(pref, attribute, &bytes, sizeof(bytes));
    }
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    if (api_->MatmulAlgoGetHeuristic(lt_, p.desc, p.a, p.b, p.d, p.d, pref, 1, &result, &found) ==
            CUBLAS_STATUS_SUCCESS &&
        found > 0) {
      p.algo = result.algo;
      p.ok = true;
    }
    api_->MatmulPreferenceDestroy(pref);
    return p;
  }

  const int ordinal_;
  const std::string name_;
  const size_t total_bytes_;
  const cuda::CublasLt* const api_;
  cudaStream_t stream_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  void* workspace_ = nullptr;
  void* convert_ = nullptr;
  size_t convert_bytes_ = 0;
  absl::flat_hash_map<const void*, void*> resident_;
  size_t resident_bytes_ = 0;
  absl::flat_hash_map<PlanKey, Plan> plans_;
  Staging staging_;
  std::vector<SequenceDesc> descs_;
  std::vector<int32_t> tables_;
  absl::Status error_;
};

}  // namespace

int CudaDeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(int ordinal) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return absl::FailedPreconditionError(
        absl::StrCat("model.device cuda:", ordinal, ": no usable CUDA device (", CudaError(e),
                     "; is there an NVIDIA GPU with its driver?)"));
  }
  if (ordinal >= count) {
    return absl::FailedPreconditionError(absl::StrCat(
        "model.device cuda:", ordinal, ": this machine has ", count, " CUDA device(s)"));
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, ordinal);
  absl::StatusOr<const cuda::CublasLt*> api = cuda::LoadCublasLt();
  if (!api.ok()) return api.status();
  auto backend = std::make_unique<CudaBackend>(ordinal, prop.name, prop.totalGlobalMem, **api);
  absl::Status s = backend->Init();
  if (!s.ok()) return s;
  return backend;
}

}  // namespace tandem::kernels
