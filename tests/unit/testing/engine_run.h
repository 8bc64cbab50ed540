// Running requests through an engine to completion, for the engine tests.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/engine/engine.h"

namespace tandem::testing {

// What one request produced over its whole run.
struct EngineResult {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;  // one per sampled token, with return_logits
  engine::FinishReason finish = engine::FinishReason::kNone;
  int cached_prompt_tokens = 0;
  std::vector<model::TokenLogprobs> prompt_logprobs;  // with Request::prompt_logprobs
};

// A greedy request that ignores EOS and returns the logits of every token it samples.
inline engine::Request Greedy(const std::string& id, std::vector<int32_t> prompt,
                              int max_tokens) {
  engine::Request r;
  r.id = id;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  r.return_logits = true;
  return r;
}

// Adds `requests` and steps `e` until nothing is left (a failure if any request is refused or
// errs, or the engine has not finished after 10000 steps).
inline std::map<std::string, EngineResult> RunAll(engine::Engine& e,
                                                  const std::vector<engine::Request>& requests) {
  for (const engine::Request& r : requests) {
    const absl::Status added = e.AddRequest(r);
    EXPECT_TRUE(added.ok()) << r.id << ": " << added;
  }
  std::map<std::string, EngineResult> results;
  for (int steps = 0; e.HasUnfinished() && steps < 10000; ++steps) {
    auto outs = e.Step();
    EXPECT_TRUE(outs.ok()) << outs.status();
    if (!outs.ok()) break;
    for (engine::RequestOutput& o : *outs) {
      EngineResult& r = results[o.id];
      r.tokens.insert(r.tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
      if (!o.logits.empty()) r.logits.push_back(std::move(o.logits));
      r.cached_prompt_tokens = o.cached_prompt_tokens;
      for (model::TokenLogprobs& lp : o.prompt_logprobs) r.prompt_logprobs.push_back(std::move(lp));
      if (o.finish != engine::FinishReason::kNone) r.finish = o.finish;
      EXPECT_TRUE(o.error.ok()) << o.error;
    }
  }
  EXPECT_FALSE(e.HasUnfinished());
  return results;
}

}  // namespace tandem::testing
