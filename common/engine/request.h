#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "common/model/sampler.h"

namespace tandem::engine {

enum class FinishReason {
  kNone,    // still running
  kStop,    // EOS or a stop token
  kLength,  // max_tokens or the context length reached
  kAbort,   // aborted by the caller
  kError,   // could not be served (see RequestOutput::error)
};

std::string_view FinishReasonName(FinishReason reason);

struct Request {
  std::string id;  // unique among unfinished requests
  std::vector<int32_t> prompt;
  // The last num_generated tokens of `prompt` were generated earlier (a decode continuing
  // after prefill, or a request migrated off a failed worker): they count towards max_tokens
  // and completion_tokens, and a seeded sampler resumes where it left off.
  int num_generated = 0;
  model::SamplingParams sampling;
  int max_tokens = 16;  // total generated tokens, num_generated included
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  // Admitted before ordinary waiting requests (the balancer's re-prefills).
  bool high_priority = false;
  // Copy the logits each token was sampled from into RequestOutput (tests, tools).
  bool return_logits = false;
  // >= 0 (with num_generated 0): the log-probability of each prompt token after the first and
  // of this many alternatives (at most SamplingParams::kMaxLogprobs), from the raw logits, in
  // the output with the first token. The prompt is then computed in full: no prefix-cache hits
  // and no pruned layers for it (its blocks still enter the prefix cache).
  int prompt_logprobs = -1;
  // Nonzero: starts the chain of the request's block hashes, so its KV blocks are shared only
  // with requests of the same salt (KvCacheManager::AddSequence). Engines that prune prefill
  // set it themselves when the request arrives without one.
  uint64_t cache_salt = 0;
};

// What one step did for one request: a new token, a finish, or both.
struct RequestOutput {
  std::string id;
  std::vector<int32_t> new_tokens;
  FinishReason finish = FinishReason::kNone;
  absl::Status error;  // set when finish == kError
  int prompt_tokens = 0;
  int cached_prompt_tokens = 0;  // prompt tokens whose KV came from the prefix cache
  int completion_tokens = 0;
  double queue_seconds = 0;  // from AddRequest to its first step (0 until admitted)
  std::vector<float> logits;  // when Request::return_logits and a token was sampled
  // With sampling.logprobs >= 0: one per new token.
  std::vector<model::TokenLogprobs> logprobs;
  // With Request::prompt_logprobs >= 0, in the output with the first token: one per prompt
  // token after the first.
  std::vector<model::TokenLogprobs> prompt_logprobs;
};

}  // namespace tandem::engine
