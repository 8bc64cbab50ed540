// Helpers shared by the engine, store and worker tests.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/engine/engine.h"
#include "common/engine/engine_loop.h"

namespace tandem::testing {

struct RunResult {
  std::vector<int32_t> tokens;
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
