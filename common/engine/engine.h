#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/engine/request.h"
#include "common/kv/kv_cache_manager.h"
#include "common/kv/kv_eviction.h"
#include "common/model/model.h"
#include "common/model/pruning.h"
#include "common/model/sampler.h"

namespace tandem::engine {

struct EngineOptions {
  int block_size = 16;
  DType kv_dtype = DType::kBF16;
  int64_t num_blocks = 0;  // 0: derive from kv_cache_bytes
  int64_t kv_cache_bytes = 1LL << 30;
  int max_num_seqs = 64;              // running sequences at once
  int max_num_batched_tokens = 2048;  // tokens per step, prefill chunks and decodes together
  int chunk_size = 512;               // prompt tokens per sequence per step
  bool enable_prefix_caching = true;
  std::string model_id;  // enters every block hash; defaults to the model path
  // kv_cache.dtype mixed: blocks of kv_dtype (fp16) for the attention-sink tokens and the recent
  // window, int8 blocks for the rest (kv::MixedKvOptions). The budget (num_blocks wide blocks'
  // worth of bytes, or kv_cache_bytes) is split into `wide_blocks` blocks of kv_dtype and int8
  // blocks for the remainder. wide_blocks 0: room for the windows of max_num_seqs sequences
  // plus one step of prefill, at most a quarter of the budget.
  struct MixedKv {
    bool enabled = false;
    int sink_tokens = 4;
    int window_tokens = 64;
    int64_t wide_blocks = 0;
  } mixed_kv;
  // Eviction over long sequences (kv_cache.eviction, kv::EvictionPolicy): once a sequence's cache
  // holds more than budget_tokens, its oldest whole blocks after the first sink_tokens are
  // evicted after each step (sliding), or up to the next topic shift (semantic), so each new
  // token attends to the sinks and the recent tokens. Positions keep their numbers (RoPE is
  // unchanged); the context length is still the model's. budget_tokens 0: off.
  kv::EvictionPolicy kv_eviction;
  // Prefill-only layer pruning (POP). A step whose batch holds at least min_batch_size
  // sequences runs its prompt tokens through the pruned layers, except each prompt's last token
  // and the protected positions; generated tokens always run every layer. Pruned KV depends on
  // the settings and (through protection) on the whole prompt, so every request of a pruning
  // engine gets a cache salt from both (PruningCacheSalt), combined with any it brings (a
  // tenant's, kv::CombineCacheSalts): its blocks are reused only by the same prompt under the
  // same settings.
  struct Pruning {
    bool enabled = false;
    model::PruningSettings settings;
    int min_batch_size = 8;
  } pruning;
};

// The cache salt of `prompt` prefilled under `settings` (never 0).
uint64_t PruningCacheSalt(const model::PruningSettings& settings, std::span<const int32_t> prompt);

// Continuous batching over a paged KV cache. Each Step() runs one forward batch that mixes
// decode tokens of running sequences with prefill chunks of new ones, without padding.
// Single-threaded: one loop owns the engine and calls AddRequest/Abort/Step.
class Engine {
 public:
  static absl::StatusOr<std::unique_ptr<Engine>> Create(model::Model& model,
                                                        const EngineOptions& options);

  // InvalidArgument for an empty prompt, ids outside the vocabulary, bad sampling values,
  // max_tokens <= 0 or past the context; AlreadyExists for a duplicate id; ResourceExhausted if
  // the request could never fit in the KV cache.
  absl::Status AddRequest(Request request);
  // Ends the request at the next step (FinishReason::kAbort) and frees its blocks.
  void Abort(const std::string& id);
  // Runs one batch. Returns an output for every request that produced a token or finished.
  absl::StatusOr<std::vector<RequestOutput>> Step();

  bool HasUnfinished() const { return !running_.empty() || !waiting_.empty() || !aborts_.empty(); }
  int NumRunning() const { return static_cast<int>(running_.size()); }
  int NumWaiting() const { return static_cast<int>(waiting_.size()); }
  // Sequences in the last step's batch (decoding, or a chunk of their prompt).
  int LastBatchSize() const { return static_cast<int>(scheduled_.size()); }
  kv::KvCacheStats KvStats() const { return kv_->Stats(); }
  kv::KvCacheManager& kv_cache() { return *kv_; }
  const kv::KvCacheManager& kv_cache() const { return *kv_; }
  model::Model& model() { return model_; }
  const EngineOptions& options() const { return options_; }
  // The cache salt AddRequest gives a request for `prompt` that arrives without one (0 unless
  // this engine prunes prefill).
  uint64_t CacheSalt(std::span<const int32_t> prompt) const;

 private:
  struct Sequence {
    Request request;
    int64_t kv_id = 0;
    std::vector<int32_t> tokens;  // prompt + generated
    int prompt_len = 0;
    int num_computed = 0;          // tokens whose KV is in the cache
    int cached_prompt_tokens = 0;  // at first admission (preemption re-admits)
    bool admitted = false;
    int completion_tokens = 0;
    std::chrono::steady_clock::time_point added = std::chrono::steady_clock::now();
    double queue_seconds = 0;  // added -> first admission
    model::Sampler sampler;
    std::vector<uint8_t> protected_positions;  // per prompt position, when pruning protects
    kv::SequenceEviction eviction;             // kv_eviction's state
    // Request::prompt_logprobs, gathered until the first token goes out.
    std::vector<model::TokenLogprobs> prompt_logprobs;
    Sequence(Request r, int64_t id, const kv::EvictionPolicy& eviction);
    // Still computing the logits of its prompt for Request::prompt_logprobs.
    bool wants_prompt_logprobs() const {
      return request.prompt_logprobs >= 0 && completion_tokens == 0;
    }
  };
  using SeqPtr = std::unique_ptr<Sequence>;
  struct Scheduled {
    Sequence* seq;
    int num_tokens;
  };

  Engine(model::Model& model, const EngineOptions& options, std::unique_ptr<kv::KvCacheManager> kv);
  void ProcessAborts(std::vector<RequestOutput>& outputs);
  void ScheduleRunning(int& budget, std::vector<RequestOutput>& outputs);
  void AdmitWaiting(int& budget);
  bool ReserveOrPreempt(Sequence& seq, int num_tokens, std::vector<RequestOutput>& outputs);
  void Preempt(std::list<SeqPtr>::iterator it);
  void Finish(Sequence& seq, FinishReason reason, RequestOutput& out);
  RequestOutput MakeOutput(const Sequence& seq) const;
  absl::Status RunBatch(std::vector<RequestOutput>& outputs);
  // The pruning plan of the scheduled batch, or nullptr when the step runs every layer.
  const model::PruningPlan* PlanPruning();
  FinishReason CheckStop(const Sequence& seq, int32_t token) const;

  model::Model& model_;
  EngineOptions options_;
  std::unique_ptr<kv::KvCacheManager> kv_;
  std::deque<SeqPtr> waiting_;
  std::list<SeqPtr> running_;  // admission order; preemption takes from the back
  std::vector<std::string> aborts_;
  absl::flat_hash_map<std::string, Sequence*> by_id_;
  int64_t next_kv_id_ = 1;
  // Per-step scratch, reused.
  std::vector<Scheduled> scheduled_;
  std::vector<model::ForwardSequence> forward_;
  std::vector<float> logits_;
  std::vector<std::pair<float, int32_t>> logprob_scratch_;
  std::vector<uint8_t> pruned_layers_;  // from options_.pruning, one per layer
  std::vector<uint8_t> full_depth_;     // per batch token, when the step prunes
  model::PruningPlan plan_;
};

}  // namespace tandem::engine
