// Helpers shared by the engine, store and worker tests.
#pragma once

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/engine/engine.h"
#include "common/engine/engine_loop.h"
#include "common/model/model.h"
#include "common/util/thread_pool.h"

namespace tandem::testing {

// A tiny random f32 model (TinySpec) loaded for each test, and engines over it. Fixtures with
// their own SetUp call TinyModelTest::SetUp() first.
class TinyModelTest : public ::testing::Test {
 protected:
  void SetUp() override;
  std::unique_ptr<engine::Engine> MakeEngine(DType kv_dtype = DType::kF32, int64_t num_blocks = 64);

  ThreadPool pool_{2};
  std::string dir_;
  std::unique_ptr<model::Model> model_;
};

struct RunResult {
  std::vector<int32_t> tokens;
  std::vector<model::TokenLogprobs> logprobs;  // when the request asked for them
  std::vector<model::TokenLogprobs> prompt_logprobs;  // Request::prompt_logprobs
  int cached_prompt_tokens = -1;  // as the first output reported it
};

// Adds `request` to `engine` and steps until nothing is left (test failures on errors).
RunResult RunToCompletion(engine::Engine& engine, engine::Request request);

// A greedy request that ignores EOS.
engine::Request GreedyRequest(std::string id, std::vector<int32_t> prompt, int max_tokens,
                              int num_generated = 0);

// Used KV blocks of the engine behind `loop`, read on the loop thread (-1 on timeout).
int64_t UsedBlocks(engine::EngineLoop& loop);

// Starts `service` on a free loopback port; `*address` gets "127.0.0.1:PORT".
std::unique_ptr<grpc::Server> ServeOnLoopback(grpc::Service* service, std::string* address);

}  // namespace tandem::testing
