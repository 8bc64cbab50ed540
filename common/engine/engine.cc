#include "common/engine/engine.h"

#include <xxhash.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/util/status_macros.h"

namespace tandem::engine {

std::string_view FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone:
      return "none";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAbort:
      return "abort";
    case FinishReason::kError:
      return "error";
  }
  return "unknown";
}

Engine::Sequence::Sequence(Request r, int64_t id, const kv::EvictionPolicy& eviction)
    : request(std::move(r)), kv_id(id), sampler(request.sampling), eviction(eviction) {
  tokens = request.prompt;
  prompt_len = static_cast<int>(tokens.size()) - request.num_generated;
  completion_tokens = request.num_generated;
  sampler.Skip(request.num_generated);
  sampler.SetHistory(tokens, request.num_generated);
}

namespace {

// Splits a mixed cache's byte budget into wide blocks and int8 blocks (EngineOptions::MixedKv).
absl::Status SplitMixedBudget(const EngineOptions& o, int64_t budget, kv::KvCacheOptions& kv) {
  const EngineOptions::MixedKv& m = o.mixed_kv;
  if (m.sink_tokens < 0 || m.window_tokens < 0 || m.wide_blocks < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("mixed KV cache: sink_tokens (", m.sink_tokens, "), window_tokens (",
                     m.window_tokens, ") and fp16 blocks (", m.wide_blocks, ") must be >= 0"));
  }
  const int64_t bs = o.block_size;
  kv::KvLayout narrow = kv.layout;
  narrow.dtype = DType::kI8;
  const auto wide_bytes = static_cast<int64_t>(kv.layout.BlockBytes());
  const auto narrow_bytes = static_cast<int64_t>(narrow.BlockBytes());
  int64_t wide = m.wide_blocks;
  if (wide == 0) {
    const int64_t per_seq = (m.sink_tokens + bs - 1) / bs + (m.window_tokens + bs - 1) / bs + 1;
    const int64_t step = (o.max_num_batched_tokens + bs - 1) / bs;
    wide = std::min(o.max_num_seqs * per_seq + step, budget / 4 / wide_bytes);
  }
  wide = std::min(wide, budget / wide_bytes);
  kv.num_blocks = wide;
  kv.mixed = {.narrow_blocks = (budget - wide * wide_bytes) / narrow_bytes,
              .sink_tokens = m.sink_tokens,
              .window_tokens = m.window_tokens};
  if (wide <= 0 || kv.mixed.narrow_blocks <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("mixed KV cache of ", budget, " bytes has no room for both ", wide_bytes,
                     "-byte fp16 blocks and ", narrow_bytes, "-byte int8 blocks"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(model::Model& model,
                                                       const EngineOptions& options) {
  if (options.block_size <= 0 || options.block_size > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("block_size must be in [1, 4096], got ", options.block_size));
  }
  if (options.max_num_seqs <= 0 || options.max_num_batched_tokens <= 0 || options.chunk_size <= 0) {
    return absl::InvalidArgumentError(
        "max_num_seqs, max_num_batched_tokens and chunk_size must be positive");
  }
  const kv::EvictionPolicy& ev = options.kv_eviction;
  if (ev.budget_tokens < 0 || ev.sink_tokens < 0 || ev.chunk_tokens <= 0 ||
      !(ev.shift_threshold >= 0 && ev.shift_threshold <= 10)) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV eviction: budget_tokens (", ev.budget_tokens, ") and sink_tokens (",
                     ev.sink_tokens, ") must be >= 0, chunk_tokens (", ev.chunk_tokens,
                     ") > 0, shift_threshold (", ev.shift_threshold, ") in [0, 10]"));
  }
  kv::KvCacheOptions kv_options;
  kv_options.layout = model.config().KvLayoutFor(options.kv_dtype, options.block_size);
  kv_options.memory = model.kv_memory();
  const int64_t block_bytes = static_cast<int64_t>(kv_options.layout.BlockBytes());
  const int64_t budget =
      options.num_blocks > 0 ? options.num_blocks * block_bytes : options.kv_cache_bytes;
  kv_options.num_blocks = budget / block_bytes;
  if (options.mixed_kv.enabled) {
    TANDEM_RETURN_IF_ERROR(SplitMixedBudget(options, budget, kv_options));
  }
  if (kv_options.num_blocks <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("kv cache of ", options.kv_cache_bytes,
                                                   " bytes holds no block of ", block_bytes,
                                                   " bytes"));
  }
  kv_options.model_id =
      options.model_id.empty() ? model.config().architecture_name : options.model_id;
  kv_options.weight_quantization = model.weights().quantization;
  kv_options.weights_fingerprint = model.weights().fingerprint;
  kv_options.enable_prefix_caching = options.enable_prefix_caching;
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<kv::KvCacheManager> kv,
                          kv::KvCacheManager::Create(kv_options));
  return std::unique_ptr<Engine>(new Engine(model, options, std::move(kv)));
}

Engine::Engine(model::Model& model, const EngineOptions& options,
               std::unique_ptr<kv::KvCacheManager> kv)
    : model_(model), options_(options), kv_(std::move(kv)) {
  if (options_.pruning.enabled) {
    pruned_layers_ = model::PrunedLayers(options_.pruning.settings, model_.config().num_layers);
  }
}

uint64_t Engine::CacheSalt(std::span<const int32_t> prompt) const {
  return options_.pruning.enabled ? PruningCacheSalt(options_.pruning.settings, prompt) : 0;
}

uint64_t PruningCacheSalt(const model::PruningSettings& settings, std::span<const int32_t> prompt) {
  const int32_t fields[] = {settings.start_layer, settings.keep_every, settings.protected_tokens};
  const uint64_t seed = XXH3_64bits(fields, sizeof(fields));
  const uint64_t salt = XXH3_64bits_withSeed(prompt.data(), prompt.size_bytes(), seed);
  return salt == 0 ? 1 : salt;
}

absl::Status Engine::AddRequest(Request request) {
  const auto& config = model_.config();
  const int64_t context = config.ContextLength();
  if (request.prompt.empty()) return absl::InvalidArgumentError("prompt is empty");
  for (int32_t t : request.prompt) {
    if (t < 0 || t >= config.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "prompt token id ", t, " is outside the vocabulary [0, ", config.vocab_size, ")"));
    }
  }
  if (static_cast<int64_t>(request.prompt.size()) >= context) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt has ", request.prompt.size(), " tokens; the context holds ", context));
  }
  if (request.max_tokens <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_tokens must be > 0, got ", request.max_tokens));
  }
  const int64_t prompt_len = static_cast<int64_t>(request.prompt.size()) - request.num_generated;
  if (request.num_generated < 0 || prompt_len < 1 || request.num_generated >= request.max_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("num_generated (", request.num_generated,
                                                   ") must leave at least one prompt token and be ",
                                                   "below max_tokens (", request.max_tokens, ")"));
  }
  if (request.max_tokens > context - prompt_len) {
    return absl::InvalidArgumentError(absl::StrCat("prompt (", prompt_len,
                                                   " tokens) + max_tokens (", request.max_tokens,
                                                   ") exceeds the context length of ", context));
  }
  TANDEM_RETURN_IF_ERROR(request.sampling.Validate());
  if (request.prompt_logprobs > model::SamplingParams::kMaxLogprobs ||
      (request.prompt_logprobs >= 0 && request.num_generated > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prompt_logprobs must be in [0, ", model::SamplingParams::kMaxLogprobs,
        "] on a request with no generated tokens, got ", request.prompt_logprobs));
  }
  const int64_t bs = options_.block_size;
  int64_t blocks_needed = (prompt_len + request.max_tokens + bs - 1) / bs;
  if (const kv::EvictionPolicy& ev = options_.kv_eviction; ev.budget_tokens > 0) {
    // An evicting sequence never holds more than its sinks, its budget and one prefill chunk.
    blocks_needed =
        std::min<int64_t>(blocks_needed, (ev.sink_tokens + bs - 1) / bs +
                                             (ev.budget_tokens + options_.chunk_size) / bs + 2);
  }
  if (blocks_needed > kv_->Stats().total_blocks) {
    return absl::ResourceExhaustedError(absl::StrCat("request needs ", blocks_needed,
                                                     " KV blocks; the cache holds ",
                                                     kv_->Stats().total_blocks));
  }
  if (by_id_.contains(request.id)) {
    return absl::AlreadyExistsError(absl::StrCat("request id \"", request.id, "\" is in use"));
  }
  auto seq = std::make_unique<Sequence>(std::move(request), next_kv_id_++, options_.kv_eviction);
  if (options_.pruning.enabled) {
    const auto& settings = options_.pruning.settings;
    // A request's own salt (a tenant's) and the pruning salt both hold.
    seq->request.cache_salt =
        kv::CombineCacheSalts(seq->request.cache_salt, CacheSalt(seq->request.prompt));
    if (settings.protected_tokens > 0) {
      seq->protected_positions.assign(seq->prompt_len, 0);
      std::vector<int32_t> special = config.eos_token_ids;
      if (config.bos_token_id >= 0) special.push_back(config.bos_token_id);
      model::MarkProtectedTokens(std::span(seq->tokens).first(seq->prompt_len),
                                 settings.protected_tokens, special, seq->protected_positions);
    }
  }
  by_id_[seq->request.id] = seq.get();
  if (seq->request.high_priority) {
    // Ahead of ordinary waiting requests, behind preempted ones and earlier high-priority ones.
    auto it = std::find_if(waiting_.begin(), waiting_.end(), [](const SeqPtr& w) {
      return !w->admitted && !w->request.high_priority;
    });
    waiting_.insert(it, std::move(seq));
  } else {
    waiting_.push_back(std::move(seq));
  }
  return absl::OkStatus();
}

void Engine::Abort(const std::string& id) {
  if (by_id_.contains(id)) aborts_.push_back(id);
}

RequestOutput Engine::MakeOutput(const Sequence& seq) const {
  RequestOutput out;
  out.id = seq.request.id;
  out.prompt_tokens = seq.prompt_len;
  out.cached_prompt_tokens = seq.cached_prompt_tokens;
  out.completion_tokens = seq.completion_tokens;
  out.queue_seconds = seq.queue_seconds;
  return out;
}

void Engine::Finish(Sequence& seq, FinishReason reason, RequestOutput& out) {
  out.finish = reason;
  kv_->FreeSequence(seq.kv_id);
  by_id_.erase(seq.request.id);
}

void Engine::ProcessAborts(std::vector<RequestOutput>& outputs) {
  for (const std::string& id : aborts_) {
    auto it = by_id_.find(id);
    if (it == by_id_.end()) continue;
    Sequence* seq = it->second;
    RequestOutput out = MakeOutput(*seq);
    Finish(*seq, FinishReason::kAbort, out);
    outputs.push_back(std::move(out));
    auto same = [seq](const SeqPtr& p) { return p.get() == seq; };
    running_.remove_if(same);
    waiting_.erase(std::remove_if(waiting_.begin(), waiting_.end(), same), waiting_.end());
  }
  aborts_.clear();
}

void Engine::Preempt(std::list<SeqPtr>::iterator it) {
  // Recompute-style preemption: drop the KV; the prefix cache often brings most of it back.
  Sequence& seq = **it;
  kv_->FreeSequence(seq.kv_id);
  seq.num_computed = 0;
  seq.eviction = kv::SequenceEviction(options_.kv_eviction);
  waiting_.push_front(std::move(*it));
  running_.erase(it);
}

bool Engine::ReserveOrPreempt(Sequence& seq, int num_tokens, std::vector<RequestOutput>& outputs) {
  for (;;) {
    absl::Status s = kv_->Reserve(seq.kv_id, seq.num_computed + num_tokens);
    if (s.ok()) return true;
    auto victim = std::prev(running_.end());
    if (victim->get() != &seq) {
      Preempt(victim);
      continue;
    }
    if (running_.size() > 1) {
      Preempt(victim);  // `seq` is the newest: it waits for blocks instead
      return false;
    }
    RequestOutput out = MakeOutput(seq);
    out.error = s;
    Finish(seq, FinishReason::kError, out);
    outputs.push_back(std::move(out));
    running_.erase(victim);
    return false;
  }
}

void Engine::ScheduleRunning(int& budget, std::vector<RequestOutput>& outputs) {
  for (auto it = running_.begin(); it != running_.end() && budget > 0; ++it) {
    Sequence& seq = **it;
    int pending = static_cast<int>(seq.tokens.size()) - seq.num_computed;
    int n = std::min({pending, options_.chunk_size, budget});
    // On failure `seq` was the last running sequence and has left the running list.
    if (!ReserveOrPreempt(seq, n, outputs)) return;
    scheduled_.push_back({&seq, n});
    budget -= n;
  }
}

void Engine::AdmitWaiting(int& budget) {
  const int bs = options_.block_size;
  while (!waiting_.empty() && budget > 0 &&
         static_cast<int>(running_.size()) < options_.max_num_seqs) {
    Sequence& seq = *waiting_.front();
    int len = static_cast<int>(seq.tokens.size());
    int upper = std::min({len, options_.chunk_size, budget});
    if (!kv_->CanAllocate((upper + bs - 1) / bs)) return;
    absl::StatusOr<int> cached = kv_->AddSequence(seq.kv_id, seq.tokens, seq.request.cache_salt,
                                                  /*reuse=*/!seq.wants_prompt_logprobs());
    if (!cached.ok()) return;
    int n = std::min({len - *cached, options_.chunk_size, budget});
    seq.num_computed = *cached;
    if (!kv_->Reserve(seq.kv_id, *cached + n).ok()) {
      kv_->CancelSequence(seq.kv_id);
      seq.num_computed = 0;
      return;
    }
    if (!seq.admitted) {  // not a re-admission
      seq.cached_prompt_tokens = *cached;
      seq.queue_seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - seq.added).count();
    }
    seq.admitted = true;
    scheduled_.push_back({&seq, n});
    budget -= n;
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
}

FinishReason Engine::CheckStop(const Sequence& seq, int32_t token) const {
  const Request& r = seq.request;
  if (std::find(r.stop_token_ids.begin(), r.stop_token_ids.end(), token) !=
      r.stop_token_ids.end()) {
    return FinishReason::kStop;
  }
  if (!r.ignore_eos && model_.config().IsEos(token)) return FinishReason::kStop;
  if (seq.completion_tokens >= r.max_tokens) return FinishReason::kLength;
  if (static_cast<int64_t>(seq.tokens.size()) >= model_.config().ContextLength()) {
    return FinishReason::kLength;
  }
  return FinishReason::kNone;
}

const model::PruningPlan* Engine::PlanPruning() {
  if (pruned_layers_.empty() ||
      static_cast<int>(scheduled_.size()) < options_.pruning.min_batch_size) {
    return nullptr;
  }
  full_depth_.clear();
  bool prunes = false;
  for (const Scheduled& s : scheduled_) {
    const Sequence& seq = *s.seq;
    for (int i = 0; i < s.num_tokens; ++i) {
      const int pos = seq.num_computed + i;
      // Only prompt tokens before the last one may skip layers (generated tokens never do,
      // even when a preempted or migrated sequence computes them again), and none of a prompt
      // whose log-probabilities were asked for.
      const bool full = pos >= seq.prompt_len - 1 || seq.wants_prompt_logprobs() ||
                        (!seq.protected_positions.empty() && seq.protected_positions[pos] != 0);
      full_depth_.push_back(full ? 1 : 0);
      prunes |= !full;
    }
  }
  if (!prunes) return nullptr;
  plan_ = model::PruningPlan{pruned_layers_, full_depth_};
  return &plan_;
}

absl::Status Engine::RunBatch(std::vector<RequestOutput>& outputs) {
  forward_.clear();
  for (const Scheduled& s : scheduled_) {
    Sequence& seq = *s.seq;
    bool samples = seq.num_computed + s.num_tokens == static_cast<int>(seq.tokens.size());
    model::LogitsMode logits = samples ? model::LogitsMode::kLast : model::LogitsMode::kNone;
    if (seq.wants_prompt_logprobs()) logits = model::LogitsMode::kAll;
    forward_.push_back({.tokens = seq.tokens.data() + seq.num_computed,
                        .num_tokens = s.num_tokens,
                        .start_pos = seq.num_computed,
                        .block_table = kv_->BlockTableData(seq.kv_id),
                        .logits = logits});
  }
  const model::PruningPlan* plan = PlanPruning();
  TANDEM_RETURN_IF_ERROR(model_.Forward(forward_, kv_->arena(), logits_, plan));
  const int64_t vocab = model_.config().vocab_size;
  int64_t row = 0;
  for (size_t i = 0; i < scheduled_.size(); ++i) {
    Sequence& seq = *scheduled_[i].seq;
    seq.num_computed += scheduled_[i].num_tokens;
    kv_->CommitTokens(seq.kv_id, seq.tokens, seq.num_computed);
    seq.eviction.Apply(*kv_, seq.kv_id, seq.num_computed);
    if (forward_[i].logits == model::LogitsMode::kNone) continue;
    if (forward_[i].logits == model::LogitsMode::kAll) {
      // Row r holds the logits after position start_pos + r, which predict the next token.
      const int rows = forward_[i].num_tokens;
      for (int r = 0; r < rows; ++r) {
        const int64_t next = forward_[i].start_pos + r + 1;
        // Positions recomputed after a preemption already have theirs.
        if (next >= seq.prompt_len ||
            next != static_cast<int64_t>(seq.prompt_logprobs.size()) + 1) {
          continue;
        }
        model::ComputeLogprobs(std::span<const float>(logits_.data() + (row + r) * vocab, vocab),
                               seq.tokens[next], seq.request.prompt_logprobs, 0.0f,
                               logprob_scratch_, seq.prompt_logprobs.emplace_back());
      }
      row += rows - 1;  // the last row samples, when the prompt is done
      if (seq.num_computed < static_cast<int>(seq.tokens.size())) {
        ++row;
        continue;
      }
    }
    std::span<const float> row_logits(logits_.data() + row * vocab, vocab);
    ++row;
    model::TokenLogprobs logprobs;
    const bool want_logprobs = seq.request.sampling.logprobs >= 0;
    int32_t token = seq.sampler.Sample(row_logits, want_logprobs ? &logprobs : nullptr);
    seq.tokens.push_back(token);
    ++seq.completion_tokens;
    RequestOutput out = MakeOutput(seq);
    out.new_tokens.push_back(token);
    if (seq.completion_tokens == 1 && seq.request.prompt_logprobs >= 0) {
      out.prompt_logprobs = std::move(seq.prompt_logprobs);
    }
    if (want_logprobs) out.logprobs.push_back(std::move(logprobs));
    if (seq.request.return_logits) out.logits.assign(row_logits.begin(), row_logits.end());
    FinishReason reason = CheckStop(seq, token);
    if (reason != FinishReason::kNone) {
      Finish(seq, reason, out);
      running_.remove_if([&seq](const SeqPtr& p) { return p.get() == &seq; });
    }
    outputs.push_back(std::move(out));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<RequestOutput>> Engine::Step() {
  std::vector<RequestOutput> outputs;
  ProcessAborts(outputs);
  scheduled_.clear();
  int budget = options_.max_num_batched_tokens;
  ScheduleRunning(budget, outputs);
  AdmitWaiting(budget);
  if (scheduled_.empty()) return outputs;
  TANDEM_RETURN_IF_ERROR(RunBatch(outputs));
  return outputs;
}

}  // namespace tandem::engine
