#include "tests/unit/testing/serving.h"

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "tests/unit/testing/temp_model.h"

namespace tandem::testing {

void TinyModelTest::SetUp() {
  dir_ = WriteTempModel(TinySpec());
  ASSERT_FALSE(dir_.empty());
  auto m = model::Model::Load(dir_, pool_);
  ASSERT_TRUE(m.ok()) << m.status();
  model_ = std::move(*m);
}

std::unique_ptr<engine::Engine> TinyModelTest::MakeEngine(DType kv_dtype, int64_t num_blocks) {
  engine::EngineOptions o;
  o.kv_dtype = kv_dtype;
  o.num_blocks = num_blocks;
  auto e = engine::Engine::Create(*model_, o);
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? std::move(*e) : nullptr;
}

RunResult RunToCompletion(engine::Engine& engine, engine::Request request) {
  RunResult result;
  absl::Status added = engine.AddRequest(std::move(request));
  EXPECT_TRUE(added.ok()) << added;
  while (added.ok() && engine.HasUnfinished()) {
    auto outputs = engine.Step();
    EXPECT_TRUE(outputs.ok()) << outputs.status();
    if (!outputs.ok()) break;
    for (const auto& o : *outputs) {
      if (result.cached_prompt_tokens < 0) result.cached_prompt_tokens = o.cached_prompt_tokens;
      result.tokens.insert(result.tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
      result.logprobs.insert(result.logprobs.end(), o.logprobs.begin(), o.logprobs.end());
      result.prompt_logprobs.insert(result.prompt_logprobs.end(), o.prompt_logprobs.begin(),
                                    o.prompt_logprobs.end());
    }
  }
  return result;
}

engine::Request GreedyRequest(std::string id, std::vector<int32_t> prompt, int max_tokens,
                              int num_generated) {
  engine::Request r;
  r.id = std::move(id);
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.num_generated = num_generated;
  r.ignore_eos = true;
  return r;
}

int64_t UsedBlocks(engine::EngineLoop& loop) {
  auto done = std::make_shared<absl::Notification>();
  auto used = std::make_shared<int64_t>(-1);
  loop.Post([done, used](engine::Engine& e) {
    *used = e.KvStats().used_blocks;
    done->Notify();
  });
  return done->WaitForNotificationWithTimeout(absl::Seconds(30)) ? *used : -1;
}

std::unique_ptr<grpc::Server> ServeOnLoopback(grpc::Service* service, std::string* address) {
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  EXPECT_NE(server, nullptr);
  *address = absl::StrCat("127.0.0.1:", port);
  return server;
}

}  // namespace tandem::testing
