#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/kernels/backend.h"
#include "common/kv/block_memory.h"
#include "common/kv/kv_layout.h"
#include "common/model/model_config.h"
#include "common/model/model_weights.h"
#include "common/util/thread_pool.h"

namespace tandem::model {

// Which logits a sequence of a batch wants back.
enum class LogitsMode { kNone, kLast, kAll };

// One sequence's share of a forward batch: `num_tokens` new tokens at positions
// start_pos.. whose K/V go to (and whose attention reads from) the blocks of `block_table`.
struct ForwardSequence {
  const int32_t* tokens = nullptr;
  int num_tokens = 0;
  int64_t start_pos = 0;
  const int32_t* block_table = nullptr;
  LogitsMode logits = LogitsMode::kLast;
};

// Prefill-only layer pruning (POP) for one forward batch. In a pruned layer, tokens that are not
// marked full-depth skip attention and the MLP (their hidden state passes through unchanged) but
// still write their K/V, projected from the hidden state that reaches the layer (input norm, K/V
// projections, k_norm where the model has it, RoPE). Full-depth tokens run the layer normally and
// attend to every token's K/V, pruned or not.
struct PruningPlan {
  std::span<const uint8_t> pruned_layers;  // one per layer; nonzero: the layer is pruned
  std::span<const uint8_t> full_depth;     // one per batch token, in batch order; nonzero: full
};

// Diagnostic hooks of one Forward call, for model-inspect (pruning statistics, layer
// importance); serving never passes one. Rows are the call's tokens in batch order.
struct ForwardProbe {
  // Input: when non-empty, one factor per layer scaling the layer's attention and MLP outputs
  // before each residual add, for every row of the call (POP's virtual gates; 1 leaves the
  // model as it is).
  std::vector<float> residual_gates;
  // Input: which rows' activations to record below (copies every layer's: a slow path).
  enum class Record { kNone, kAllRows, kLastRow };
  Record record = Record::kNone;
  // num_layers + 1 entries of [rows x hidden] (rows: all, or the call's last): hidden[l]
  // enters layer l; hidden[num_layers] leaves the last layer (before the final norm).
  std::vector<std::vector<float>> hidden;
  // num_layers entries of [rows x hidden]: each layer's attention output (o_proj, before the
  // residual add and any gate); zero for rows that skipped attention in a pruned layer.
  std::vector<std::vector<float>> attention;
  // num_layers entries of [q_width]: the query of the call's last row (after q_norm and RoPE),
  // to recompute its attention map from the cache; empty where that row skipped attention.
  std::vector<std::vector<float>> last_query;
};

// A Llama-family decoder. Batches are ragged (no padding): the new tokens of every sequence
// are concatenated, projections run once over all of them, attention runs per sequence over its
// paged KV. The arithmetic runs on a kernels::Backend (the CPU's, or a GPU's), which holds the
// weights it reads and the activations; the model itself only plans each batch. Not
// thread-safe: one engine loop drives a Model; the kernels parallelize inside each call.
class Model {
 public:
  // The weights of DIR on the backend options.device names (CPU kernels run on `pool`).
  static absl::StatusOr<std::unique_ptr<Model>> Load(const std::string& dir, ThreadPool& pool,
                                                     const WeightLoadOptions& options = {});
  // A model on `backend`: InvalidArgument or ResourceExhausted when the weights cannot be put
  // where the backend computes (a layout it cannot read, too little device memory).
  static absl::StatusOr<std::unique_ptr<Model>> Create(ModelConfig config,
                                                       std::unique_ptr<ModelWeights> weights,
                                                       std::unique_ptr<kernels::Backend> backend,
                                                       ThreadPool& pool);
  // On the CPU backend, for tests and tools that build configs/weights themselves.
  Model(ModelConfig config, std::unique_ptr<ModelWeights> weights, ThreadPool& pool);
  ~Model();

  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return *weights_; }
  ThreadPool& pool() { return pool_; }
  kernels::Backend& backend() { return *backend_; }
  // Where a KV pool for this model must live: null for host memory (the backend computes on
  // the host), else the backend's own memory.
  kv::BlockMemory* kv_memory() { return backend_->host_addressable() ? nullptr : &kv_memory_; }

  // Runs the batch, writing each new token's K/V into its cache slot. `logits` receives, in
  // batch order, vocab_size floats per requested row (0, 1 or num_tokens rows per sequence).
  // InvalidArgument for token ids outside the vocabulary or positions past the context, or a
  // pruning plan whose sizes do not match the model and batch.
  absl::Status Forward(std::span<const ForwardSequence> batch, uint8_t* kv_base,
                       const kv::KvLayout& layout, std::vector<float>& logits,
                       const PruningPlan* pruning = nullptr, ForwardProbe* probe = nullptr);
  // The same over any pool of blocks, a mixed-precision one included.
  absl::Status Forward(std::span<const ForwardSequence> batch, const kv::KvArena& kv,
                       std::vector<float>& logits, const PruningPlan* pruning = nullptr,
                       ForwardProbe* probe = nullptr);

 private:
  // A KV pool in the backend's memory.
  class BackendKvMemory final : public kv::BlockMemory {
   public:
    explicit BackendKvMemory(kernels::Backend& backend) : backend_(backend) {}
    absl::StatusOr<uint8_t*> Map(size_t bytes) override;
    void Unmap(uint8_t* base, size_t bytes) override { backend_.Free(base); }
    bool host_addressable() const override { return backend_.host_addressable(); }
    void ToHost(uint8_t* host_dst, const uint8_t* src, size_t bytes) override {
      backend_.CopyToHost(host_dst, src, bytes);
    }
    void FromHost(uint8_t* dst, const uint8_t* host_src, size_t bytes) override {
      backend_.CopyFromHost(dst, host_src, bytes);
    }

   private:
    kernels::Backend& backend_;
  };

  // Scratch activations in backend memory, grown to the largest batch seen and reused (no
  // per-step allocation), and the host-side plan of the step.
  struct Workspace {
    kernels::BackendBuffer hidden, normed, q, k, v, attn, proj, gate_up, mlp;
    kernels::BackendBuffer gathered;  // rows of the full-depth tokens in a pruned layer
    kernels::BackendBuffer logits;    // when backend memory is not the host's
    std::vector<int32_t> tokens;
    std::vector<int64_t> positions;
    std::vector<int64_t> full_rows;       // batch rows of the full-depth tokens
    std::vector<int64_t> full_positions;  // their positions
    std::vector<int64_t> logit_rows;
    std::vector<kernels::AttentionSequence> attention;  // per-sequence views for one layer
    std::vector<kernels::KvWrite> kv_writes;            // one per sequence of the batch
    absl::Status Reserve(kernels::Backend& backend, const ModelConfig& c, int64_t tokens);
  };
  // One layer's weights where the backend reads them. Vectors are null when absent.
  struct LayerView {
    const float* input_norm = nullptr;
    kernels::WeightMatrix q_proj, k_proj, v_proj, o_proj;
    const float* q_bias = nullptr;
    const float* k_bias = nullptr;
    const float* v_bias = nullptr;
    const float* q_norm = nullptr;
    const float* k_norm = nullptr;
    const float* post_attention_norm = nullptr;
    kernels::WeightMatrix gate_proj, up_proj, down_proj;
  };

  Model(ModelConfig config, std::unique_ptr<ModelWeights> weights,
        std::unique_ptr<kernels::Backend> backend, ThreadPool& pool);
  // Makes every weight resident on the backend and fills the views below.
  absl::Status BindWeights();
  absl::Status Validate(std::span<const ForwardSequence> batch, const kv::KvLayout& layout,
                        int64_t* total_tokens) const;
  void Embed(std::span<const ForwardSequence> batch, int64_t total);
  void AttentionBlock(int layer, std::span<const ForwardSequence> batch, int64_t total,
                      const kv::KvArena& kv);
  // A pruned layer: K/V for every token, attention and MLP for the rows in ws_.full_rows only.
  void PrunedLayer(int layer, std::span<const ForwardSequence> batch, int64_t total,
                   const kv::KvArena& kv);
  // With a recording probe: copies ws_.proj (the o_proj output of the batch rows `rows`,
  // compacted; all rows when null) and the query in row `last_query_row` of ws_.q (-1: none).
  void RecordAttention(int layer, int64_t total, const std::vector<int64_t>* rows,
                       int64_t last_query_row);
  // ws_.proj[0:rows] *= the probe's gate of `layer`, if any.
  void GateBranch(int layer, int64_t rows);
  // Finishes the K of `rows` rows in ws_.k (k_norm, RoPE) and writes K and V (ws_.v) to each
  // sequence's cache slots. `queries` (rows x q_width, q_norm applied), when given, get their
  // RoPE in the same pass.
  void ProjectKv(int layer, int64_t rows, const kv::KvArena& kv, float* queries);
  // hidden[0:rows] += MLP(post_attention_norm(hidden[0:rows])).
  void MlpBlock(int layer, float* hidden, int64_t rows);
  absl::Status ComputeLogits(std::span<const ForwardSequence> batch, std::vector<float>& logits);
  // A copy of `rows` rows of `width` floats of backend memory, from row `first`.
  std::vector<float> ReadRows(const float* src, int64_t first, int64_t rows, int64_t width);

  ModelConfig config_;
  std::unique_ptr<ModelWeights> weights_;
  std::unique_ptr<kernels::Backend> backend_;
  ThreadPool& pool_;
  std::vector<float> inv_freq_;
  // The weights as the backend reads them.
  std::vector<LayerView> layers_;
  kernels::WeightMatrix embed_tokens_, lm_head_;
  const float* final_norm_ = nullptr;
  const float* inv_freq_resident_ = nullptr;
  BackendKvMemory kv_memory_{*backend_};
  // The geometry every layer function needs, in the order they unpack it.
  struct Dims {
    int64_t hidden;
    int heads, kv_heads, head_dim;
    int64_t q_width, kv_width;  // heads * head_dim, kv_heads * head_dim
    float eps;                  // RMSNorm epsilon
  } dims_;
  Workspace ws_;
  ForwardProbe* probe_ = nullptr;  // the current Forward call's, if any
};

}  // namespace tandem::model
