// The router over real gRPC services on loopback: a cache-store shard, two prefill and two
// decode workers on a tiny random model. Streams equal one engine's greedy output; bad input,
// queue limits and shutdown give the documented statuses; cancel frees every block; a prefill
// worker that is down and a decode worker that dies mid-stream cost nothing but time; misses
// while the balancer is engaged are re-prefilled.
#include "router/router_service.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <optional>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/rpc/engine_proto.h"
#include "absl/synchronization/notification.h"
#include "cache_store/cache_store_service.h"
#include "decode_worker/decode_service.h"
#include "prefill_worker/prefill_service.h"
#include "router/registry_service.h"
#include "tests/unit/router/router_cluster.h"
#include "tests/unit/testing/eventually.h"

namespace tandem::router {
namespace {

using tandem::v1::GenerateRequest;
using tandem::v1::GenerateResponse;
using testing::Result;

// A prefill worker that never answers until released: holds requests in the router's queue.
class StuckPrefill final : public tandem::v1::PrefillWorker::CallbackService {
 public:
  grpc::ServerUnaryReactor* Prefill(grpc::CallbackServerContext* context,
                                    const tandem::v1::PrefillRequest*,
                                    tandem::v1::PrefillResponse*) override {
    absl::MutexLock lock(&mu_);
    reactors_.push_back(context->DefaultReactor());
    return reactors_.back();
  }
  int held() {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(reactors_.size());
  }
  void Release() {
    absl::MutexLock lock(&mu_);
    for (auto* r : reactors_) r->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no"));
    reactors_.clear();
  }

 private:
  absl::Mutex mu_;
  std::vector<grpc::ServerUnaryReactor*> reactors_;
};

// The value of an unlabelled sample in a /metrics exposition (NaN if absent).
double SampleValue(const std::string& text, const std::string& name) {
  const size_t at = text.find("\n" + name + " ");
  return at == std::string::npos ? std::nan("") : std::stod(text.substr(at + name.size() + 2));
}

class RouterServiceTest : public testing::RouterClusterTest {};

TEST_F(RouterServiceTest, ConcurrentStreamsEqualOneEngine) {
  StartCluster();
  constexpr int kRequests = 12;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int> max_tokens;
  for (int i = 0; i < kRequests; ++i) {
    prompts.push_back(Prompt(3 + i * 9, i));
    max_tokens.push_back(1 + (i * 7) % 20);
  }
  std::vector<Result> results(kRequests);
  std::vector<std::thread> threads;
  for (int i = 0; i < kRequests; ++i) {
    threads.emplace_back([&, i] { results[i] = Generate(Request(prompts[i], max_tokens[i])); });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_TRUE(results[i].status.ok()) << i << ": " << results[i].status.error_message();
    EXPECT_EQ(results[i].tokens, Expected(prompts[i], max_tokens[i])) << "request " << i;
    const auto& c = results[i].complete;
    EXPECT_EQ(c.finish_reason(), tandem::v1::FINISH_REASON_LENGTH);
    EXPECT_EQ(c.usage().prompt_tokens(), static_cast<int>(prompts[i].size()));
    EXPECT_EQ(c.usage().completion_tokens(), max_tokens[i]);
    EXPECT_GT(c.timings().time_to_first_token(), 0);
  }
  EXPECT_TRUE(testing::Eventually([&] { return AllBlocksFree(); }, std::chrono::seconds(5)));
  EXPECT_NE(
      metrics_.Serialize().find(
          "tandem_time_to_first_token_seconds_count{api=\"grpc\",role=\"router\"} 12"),
      std::string::npos);
  // The planner advisor's measurement saw every request, with its prompt and output lengths
  // (a finish is recorded just after the last message is sent, so wait for it).
  double prompt_sum = 0, output_sum = 0;
  for (int i = 0; i < kRequests; ++i) {
    prompt_sum += static_cast<double>(prompts[i].size());
    output_sum += max_tokens[i];
  }
  WorkloadStats::Snapshot seen;
  EXPECT_TRUE(testing::Eventually(
      [&] {
        seen = router_->workload().Take(router_->clock().Now());
        return seen.output_tokens.count == kRequests;
      },
      std::chrono::seconds(5)));
  EXPECT_EQ(seen.prompt_tokens.count, kRequests);
  EXPECT_NEAR(seen.prompt_tokens.mean, prompt_sum / kRequests, 1e-9);
  EXPECT_NEAR(seen.output_tokens.mean, output_sum / kRequests, 1e-9);
  EXPECT_GT(seen.ttft_s.mean, 0);
  // Balancer idle: the recommended ratio is the pools' own, 2:2, as the registry publishes it.
  RegistryService registry(*router_, std::chrono::seconds(1), &metrics_);
  EXPECT_EQ(SampleValue(metrics_.Serialize(), "tandem_balancer_recommended_prefill_decode_ratio"),
            1.0);
}

TEST_F(RouterServiceTest, LogprobsAndPenaltiesCrossTheWholePath) {
  StartCluster();
  const std::vector<int32_t> prompt = Prompt(37, 5);
  tandem::v1::GenerateRequest request = Request(prompt, 12);
  tandem::v1::SamplingParams* s = request.mutable_sampling();
  s->set_frequency_penalty(1.5f);
  s->set_presence_penalty(0.5f);
  s->set_repetition_penalty(1.2f);
  s->set_logprobs(true);
  s->set_top_logprobs(3);
  const Result r = Generate(request);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  // The same request on one engine: the prefill worker's first token and the decode worker's
  // others must agree with it, penalties and log-probabilities included.
  engine::Request direct = testing::GreedyRequest("x", prompt, 12);
  direct.sampling = rpc::ToSamplingParams(request.sampling());
  auto e = MakeEngine();
  const testing::RunResult want = testing::RunToCompletion(*e, direct);
  EXPECT_EQ(r.tokens, want.tokens);
  EXPECT_NE(want.tokens, Expected(prompt, 12)) << "the penalties changed nothing";
  ASSERT_EQ(r.logprobs.size(), want.logprobs.size());
  ASSERT_EQ(r.logprobs.size(), 12u);
  for (size_t i = 0; i < r.logprobs.size(); ++i) {
    EXPECT_NEAR(r.logprobs[i].logprob(), want.logprobs[i].logprob, 1e-5) << i;
    ASSERT_EQ(r.logprobs[i].top_token_ids_size(), 3) << i;
    for (int j = 0; j < 3; ++j) {
      EXPECT_EQ(r.logprobs[i].top_token_ids(j), want.logprobs[i].top[j].first) << i;
      EXPECT_NEAR(r.logprobs[i].top_logprobs(j), want.logprobs[i].top[j].second, 1e-5) << i;
    }
    EXPECT_EQ(r.logprobs[i].top_token_ids(0), r.tokens[i]) << "greedy takes the most likely";
  }
  // Without logprobs, none are sent.
  EXPECT_TRUE(Generate(Request(prompt, 3)).logprobs.empty());
}

TEST_F(RouterServiceTest, BadInputIsInvalidArgument) {
  StartCluster();
  std::vector<GenerateRequest> bad(5);
  bad[0].mutable_sampling()->set_max_tokens(4);  // no prompt
  bad[1] = Request({1, 2, 3}, 0);                // max_tokens 0
  bad[2] = Request({1, 200}, 4);                 // outside the vocabulary
  bad[3] = Request({1, 2}, 4);
  bad[3].mutable_sampling()->set_temperature(-1);
  bad[4] = Request(Prompt(600, 1), 4);  // longer than the context
  for (const auto& r : bad) {
    const Result res = Generate(r);
    EXPECT_EQ(res.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << res.status.error_message();
    EXPECT_FALSE(res.status.error_message().empty());
  }
  // Text needs a tokenizer, which this router has not got.
  GenerateRequest text;
  text.set_prompt("hello");
  text.mutable_sampling()->set_max_tokens(2);
  EXPECT_EQ(Generate(text).status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  grpc::ClientContext context;
  tandem::v1::ModelInfo info;
  ASSERT_TRUE(stub_->GetModelInfo(&context, {}, &info).ok());
  EXPECT_EQ(info.context_length(), 512);
  EXPECT_EQ(info.vocab_size(), 128);
}

TEST_F(RouterServiceTest, AfterShutdownBeginsRequestsAreUnavailable) {
  StartCluster();
  router_->BeginShutdown();
  EXPECT_EQ(Generate(Request({1, 2, 3}, 2)).status.error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST_F(RouterServiceTest, QueueLimitIsResourceExhausted) {
  RouterOptions options;
  options.max_queued_requests = 1;
  StartCluster(64 << 20, options);
  StuckPrefill stuck;
  std::string stuck_address;
  auto stuck_server = testing::ServeOnLoopback(&stuck, &stuck_address);
  for (const auto& a : prefill_addresses_) router_->prefill_pool().Remove(a);
  router_->prefill_pool().Add(stuck_address);

  Result first;
  std::thread t([&] { first = Generate(Request({1, 2, 3}, 2)); });
  ASSERT_TRUE(testing::Eventually([&] { return stuck.held() == 1; }, std::chrono::seconds(10)));
  const Result second = Generate(Request({4, 5, 6}, 2));
  EXPECT_EQ(second.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(second.status.error_message().find("max_queued_requests"), std::string::npos);
  stuck.Release();
  t.join();
  EXPECT_EQ(first.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(router_->GetLoad().waiting, 0);
  stuck_server->Shutdown(std::chrono::system_clock::now());
}

// sampling.prompt_logprobs: the prefill worker (or, colocated, the decode worker) computes them
// once, and the first chunk carries them with the prompt's ids.
void ExpectPromptLogprobs(testing::RouterClusterTest& t, const Result& r,
                          const std::vector<int32_t>& prompt, const testing::RunResult& want) {
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.chunks_with_prompt_logprobs, 1);
  EXPECT_EQ(r.prompt_token_ids, prompt);
  ASSERT_EQ(r.prompt_logprobs.size(), prompt.size() - 1);
  ASSERT_EQ(want.prompt_logprobs.size(), prompt.size() - 1);
  for (size_t i = 0; i < r.prompt_logprobs.size(); ++i) {
    EXPECT_NEAR(r.prompt_logprobs[i].logprob(), want.prompt_logprobs[i].logprob, 1e-5) << i;
    ASSERT_EQ(r.prompt_logprobs[i].top_token_ids_size(), 3) << i;
    for (int j = 0; j < 3; ++j) {
      EXPECT_EQ(r.prompt_logprobs[i].top_token_ids(j), want.prompt_logprobs[i].top[j].first);
    }
  }
  EXPECT_EQ(r.tokens, want.tokens);
}

TEST_F(RouterServiceTest, PromptLogprobsComeOnceInTheFirstChunk) {
  StartCluster();
  const std::vector<int32_t> prompt = Prompt(37, 9);
  GenerateRequest request = Request(prompt, 6);
  request.mutable_sampling()->set_prompt_logprobs(true);
  request.mutable_sampling()->set_top_logprobs(3);
  // Twice: the second finds the prompt cached and computes it anyway.
  for (int round = 0; round < 2; ++round) {
    const Result r = Generate(request);
    engine::Request direct = testing::GreedyRequest("x", prompt, 6);
    direct.prompt_logprobs = 3;
    auto e = MakeEngine();
    ExpectPromptLogprobs(*this, r, prompt, testing::RunToCompletion(*e, direct));
    EXPECT_EQ(r.complete.usage().cached_prompt_tokens(), 0) << round;
    EXPECT_TRUE(r.logprobs.empty());  // only the prompt's were asked for
  }
}

TEST_F(RouterServiceTest, AClientThatStopsReadingIsCancelledAfterTheWriteTimeout) {
  RouterOptions options;
  options.grpc_write_timeout = std::chrono::milliseconds(300);
  StartCluster(64 << 20, options);
  // A client with a small flow-control window that never reads: the router's writes stall.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 1024);
  auto stub = tandem::v1::Inference::NewStub(
      grpc::CreateCustomChannel(router_address_, grpc::InsecureChannelCredentials(), args));
  GenerateRequest request = Request(Prompt(40, 3), 400);
  request.mutable_sampling()->set_logprobs(true);
  request.mutable_sampling()->set_top_logprobs(20);  // ~200 bytes a message
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto reader = stub->Generate(&context, request);
  // The router cuts the stream off on its own, long before the deadline (the tiny model may
  // have generated every token by then: the request has left the workers either way).
  auto cut_off = [&] {
    for (absl::string_view line : absl::StrSplit(metrics_.Serialize(), '\n')) {
      if (absl::StartsWith(line, "tandem_stalled_streams_total{") &&
          absl::StrContains(line, "api=\"grpc\"") && absl::StrContains(line, "role=\"router\"")) {
        return absl::EndsWith(line, " 1");
      }
    }
    return false;
  };
  EXPECT_TRUE(testing::Eventually(cut_off, std::chrono::seconds(10))) << metrics_.Serialize();
  EXPECT_TRUE(testing::Eventually([&] { return AllBlocksFree(); }, std::chrono::seconds(5)));
  tandem::v1::GenerateResponse msg;
  int read = 0;
  while (reader->Read(&msg)) ++read;
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_LT(read, 400);
  // A client that reads is never cut off, however long its stream.
  const Result ok = Generate(Request(Prompt(40, 4), 200));
  EXPECT_TRUE(ok.status.ok()) << ok.status.error_message();
}

TEST_F(RouterServiceTest, ClientCancelFreesEverythingWithinASecond) {
  StartCluster();
  const Result r = Generate(Request(Prompt(40, 3), 400), [](int n, grpc::ClientContext& c) {
    if (n == 3) c.TryCancel();
  });
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(testing::Eventually([&] { return AllBlocksFree(); }, std::chrono::seconds(30)));
}

TEST_F(RouterServiceTest, PrefillWorkerDownIsRetriedElsewhere) {
  StartCluster();
  prefill_servers_[0]->Shutdown(std::chrono::system_clock::now());
  for (int i = 0; i < 3; ++i) {
    const std::vector<int32_t> prompt = Prompt(20 + i, i);
    const Result r = Generate(Request(prompt, 5));
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.tokens, Expected(prompt, 5));
  }
}

TEST_F(RouterServiceTest, DecodeWorkerDyingMidStreamIsMigrated) {
  StartCluster();
  const std::vector<int32_t> prompt = Prompt(35, 9);
  constexpr int kTokens = 300;
  // Decode worker 0 steps only as the client reads: a gate lets it take one engine step per
  // chunk the client has read (and a few to start), so it is still streaming when it is killed
  // at the fifth chunk however slowly this client reads. Killing it needs no step: a cancelled
  // decode stream ends at once.
  struct Gate {
    absl::Mutex mu;
    int steps = 4;  // guarded by mu
    bool open = false;
  } gate;
  engine::EngineLoop::TaskFn step = [&](engine::Engine& e) {
    absl::MutexLock lock(&gate.mu);
    if (e.HasUnfinished()) {
      gate.mu.Await(absl::Condition(
          +[](Gate* g) { return g->open || g->steps > 0; }, &gate));
      if (!gate.open) --gate.steps;
    } else {  // idle: nothing to hold back, look again soon
      gate.mu.AwaitWithTimeout(absl::Condition(&gate.open), absl::Milliseconds(1));
    }
    if (!gate.open) decode_loops_[0]->Post(step);
  };
  decode_loops_[0]->Post(step);
  auto set_gate = [&](bool open) {
    absl::MutexLock lock(&gate.mu);
    gate.open = open;
    ++gate.steps;
  };
  // With no load anywhere the first decode worker is chosen; kill it after a few chunks.
  const Result r = Generate(Request(prompt, kTokens), [&](int n, grpc::ClientContext&) {
    if (n == 5) decode_servers_[0]->Shutdown(std::chrono::system_clock::now());
    set_gate(n >= 5);
  });
  set_gate(true);
  absl::Notification drained;  // the last gate task has run
  decode_loops_[0]->Post([&](engine::Engine&) { drained.Notify(); });
  drained.WaitForNotification();
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.tokens, Expected(prompt, kTokens));
  EXPECT_EQ(r.complete.usage().completion_tokens(), kTokens);
  EXPECT_GT(decodes_[1]->kv_hits() + decodes_[1]->kv_misses(), 0);  // it moved
}

TEST_F(RouterServiceTest, MissesWhileEngagedAreReprefilled) {
  RouterOptions options;
  options.balancer.min_lookups = 1;
  // Two blocks of store: a 4-block prompt evicts its own first blocks before decode reads them.
  StartCluster(2 * 8192, options);
  for (int i = 0; i < 4; ++i) {
    const std::vector<int32_t> prompt = Prompt(70, 20 + i);
    const Result r = Generate(Request(prompt, 6));
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.tokens, Expected(prompt, 6)) << i;
  }
  EXPECT_TRUE(router_->balancer().engaged(Clock::now()));
  EXPECT_GE(router_->balancer().reschedules(), 1);
  EXPECT_NE(metrics_.Serialize().find("tandem_balancer_state 1"), std::string::npos);

  // The registry publishes the pools and the ratio autoscalers follow: prefill:decode (2:2),
  // scaled by hit rate / threshold while the balancer is engaged.
  RegistryService registry(*router_, std::chrono::seconds(1), &metrics_);
  const std::optional<double> rate = router_->balancer().HitRate(Clock::now());
  ASSERT_TRUE(rate.has_value());
  const std::string text = metrics_.Serialize();
  EXPECT_NE(text.find("tandem_workers{pool=\"prefill\"} 2"), std::string::npos) << text;
  EXPECT_NE(text.find("tandem_workers{pool=\"decode\"} 2"), std::string::npos) << text;
  EXPECT_NEAR(SampleValue(text, "tandem_balancer_recommended_prefill_decode_ratio"),
              *rate / options.balancer.hit_rate_threshold, 1e-9);
  EXPECT_LT(*rate, options.balancer.hit_rate_threshold);
}

}  // namespace
}  // namespace tandem::router

namespace tandem::router {
namespace {

TEST_F(RouterServiceTest, ColocatedModeRunsWholeRequestsOnDecodeWorkers) {
  RouterOptions options;
  options.colocated = true;
  StartCluster(64 << 20, options);
  for (const auto& a : prefill_addresses_) router_->prefill_pool().Remove(a);
  std::vector<Result> results(4);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] { results[i] = Generate(Request(Prompt(10 + 20 * i, i), 12)); });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(results[i].status.ok()) << results[i].status.error_message();
    EXPECT_EQ(results[i].tokens, Expected(Prompt(10 + 20 * i, i), 12)) << i;
  }
  EXPECT_EQ(block_store_->Stats().puts, 0);  // nothing went through the store
  // Colocated, the decode worker computes the prompt's log-probabilities.
  const std::vector<int32_t> prompt = Prompt(29, 7);
  GenerateRequest request = Request(prompt, 4);
  request.mutable_sampling()->set_prompt_logprobs(true);
  request.mutable_sampling()->set_top_logprobs(3);
  engine::Request direct = testing::GreedyRequest("x", prompt, 4);
  direct.prompt_logprobs = 3;
  auto e = MakeEngine();
  ExpectPromptLogprobs(*this, Generate(request), prompt, testing::RunToCompletion(*e, direct));
  // No prefill pool, so no tandem_workers{pool="prefill"} for an alert to find at 0.
  RegistryService registry(*router_, std::chrono::seconds(1), &metrics_);
  const std::string text = metrics_.Serialize();
  EXPECT_EQ(text.find("tandem_workers{pool=\"prefill\"}"), std::string::npos) << text;
  EXPECT_NE(text.find("tandem_workers{pool=\"decode\"} 2"), std::string::npos) << text;
  EXPECT_EQ(SampleValue(text, "tandem_balancer_recommended_prefill_decode_ratio"), 0.0);
}

}  // namespace
}  // namespace tandem::router

namespace tandem::router {
namespace {

using testing::Result;

class CacheSaltTest : public testing::RouterClusterTest {};

// A cache salt keeps requests apart: the same prompt under another salt (another tenant's)
// reuses none of the first one's cached blocks, under the same salt it does; the tokens are the
// same either way.
TEST_F(CacheSaltTest, ASaltSharesCachedBlocksOnlyWithItself) {
  StartCluster();
  std::vector<int32_t> prompt;
  for (int i = 0; i < 48; ++i) prompt.push_back(1 + (i * 7) % 100);
  const auto request = [&](const std::string& salt) {
    tandem::v1::GenerateRequest r;
    r.mutable_prompt_token_ids()->Add(prompt.begin(), prompt.end());
    r.mutable_sampling()->set_max_tokens(4);
    r.mutable_sampling()->set_ignore_eos(true);
    r.set_cache_salt(salt);
    return r;
  };
  const Result alice = Generate(request("alice"));
  ASSERT_TRUE(alice.status.ok()) << alice.status.error_message();
  EXPECT_EQ(alice.complete.usage().cached_prompt_tokens(), 0);
  const Result again = Generate(request("alice"));
  EXPECT_GE(again.complete.usage().cached_prompt_tokens(), 32);
  const Result bob = Generate(request("bob"));
  EXPECT_EQ(bob.complete.usage().cached_prompt_tokens(), 0);
  const Result none = Generate(request(""));
  EXPECT_EQ(none.complete.usage().cached_prompt_tokens(), 0);
  EXPECT_EQ(alice.tokens, bob.tokens);
  EXPECT_EQ(alice.tokens, none.tokens);
  EXPECT_EQ(Generate(request(std::string(257, 's'))).status.error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

}  // namespace
}  // namespace tandem::router
