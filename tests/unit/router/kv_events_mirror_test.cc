// KV events end to end. Without the network: a real engine serves random prompts in a cache
// small enough to evict; its heartbeats (WorkerLoadReporter) feed the router's WorkerPool. After
// every heartbeat the pool applies, its view of the worker equals the worker's prefix index;
// a heartbeat lost on the way is noticed as a gap, answered with a resync, and the snapshot
// that follows restores the view. Then over gRPC: a decode worker's agent registers with a real
// registry and its heartbeats bring the router the worker's index.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <random>
#include <vector>

#include "absl/synchronization/notification.h"
#include "common/engine/engine_loop.h"
#include "common/rpc/worker_load.h"
#include "decode_worker/decode_worker.h"
#include "router/registry_service.h"
#include "router/router_service.h"
#include "router/worker_pool.h"
#include "tests/unit/testing/eventually.h"
#include "tests/unit/testing/serving.h"

namespace tandem::router {
namespace {

class KvEventsMirrorTest : public testing::TinyModelTest {
 protected:
  // Runs `request` on the loop to its end.
  static void Run(engine::EngineLoop& loop, engine::Request request) {
    auto done = std::make_shared<absl::Notification>();
    loop.Submit(std::move(request), [done](const engine::RequestOutput& out, engine::Engine&) {
      if (out.finish != engine::FinishReason::kNone) done->Notify();
    });
    ASSERT_TRUE(done->WaitForNotificationWithTimeout(absl::Seconds(30)));
  }

  static std::vector<uint64_t> Indexed(engine::EngineLoop& loop) {
    auto done = std::make_shared<absl::Notification>();
    auto hashes = std::make_shared<std::vector<uint64_t>>();
    loop.Post([done, hashes](engine::Engine& e) {
      *hashes = e.kv_cache().IndexedHashes();
      done->Notify();
    });
    EXPECT_TRUE(done->WaitForNotificationWithTimeout(absl::Seconds(30)));
    std::sort(hashes->begin(), hashes->end());
    return *hashes;
  }

  static std::vector<uint64_t> Sorted(std::vector<uint64_t> v) {
    std::sort(v.begin(), v.end());
    return v;
  }
};

TEST_F(KvEventsMirrorTest, TheRoutersViewFollowsRandomAdmissionsEvictionsAndALostHeartbeat) {
  engine::EngineLoop loop(MakeEngine(DType::kF32, /*num_blocks=*/12));
  rpc::WorkerLoadReporter reporter(loop);
  WorkerPoolOptions options;
  options.index_capacity = 1 << 16;
  WorkerPool pool("decode", options);
  const std::string id = pool.Register("w:1");

  std::mt19937 rng(17);
  std::vector<std::vector<int32_t>> prefixes;  // shared prefixes: hits as well as evictions
  for (int p = 0; p < 5; ++p) {
    std::vector<int32_t> prefix;
    for (int i = 0; i < 32; ++i) prefix.push_back(static_cast<int32_t>(rng() % 128));
    prefixes.push_back(prefix);
  }
  bool full = true;  // as after registering
  int applied = 0, resyncs = 0, lost = 0;
  for (int round = 0; round < 40; ++round) {
    const int requests = 1 + static_cast<int>(rng() % 3);
    for (int r = 0; r < requests; ++r) {
      std::vector<int32_t> prompt = prefixes[rng() % prefixes.size()];
      const int tail = static_cast<int>(rng() % 40);
      for (int i = 0; i < tail; ++i) prompt.push_back(static_cast<int32_t>(rng() % 128));
      Run(loop, testing::GreedyRequest("r" + std::to_string(round * 10 + r), prompt, 3));
    }
    tandem::v1::WorkerLoad load;
    reporter.Fill(&load, full);
    if (round % 9 >= 4 && lost * 9 <= round - 4 && load.kv_events_size() > 0) {
      // Lost on the way with events in it, and the worker never learns of it.
      ++lost;
      full = false;
      continue;
    }
    const HeartbeatResult result = pool.Heartbeat(id, load);
    ASSERT_TRUE(result.known);
    full = result.resync;
    if (result.resync) {
      ++resyncs;
      continue;
    }
    ++applied;
    ASSERT_EQ(Sorted(pool.KnownBlocks("w:1")), Indexed(loop)) << "round " << round;
  }
  EXPECT_GE(lost, 3);
  EXPECT_EQ(resyncs, lost);  // each loss is a gap the pool noticed
  EXPECT_GE(applied, 30);
  auto evictions = std::make_shared<int64_t>(0);
  auto done = std::make_shared<absl::Notification>();
  loop.Post([evictions, done](engine::Engine& e) {
    *evictions = e.KvStats().evictions;
    done->Notify();
  });
  ASSERT_TRUE(done->WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_GT(*evictions, 0);  // the cache was small enough to evict
}

TEST_F(KvEventsMirrorTest, AWorkersAgentRegistersAndItsIndexReachesTheRouter) {
  RouterOptions o;
  o.model_id = "tiny";
  RouterService router(o, nullptr, nullptr);
  RegistryService registry(router, std::chrono::milliseconds(50), nullptr);
  std::string address;
  auto server = testing::ServeOnLoopback(&registry, &address);

  metrics::Metrics metrics;
  engine::EngineLoop loop(MakeEngine(DType::kF32, /*num_blocks=*/24));
  store::StorePool store({}, "tiny");
  decode::DecodeWorker worker(loop, store, metrics);
  rpc::WorkerAgentOptions agent;
  agent.router = address;
  agent.registration.set_address("127.0.0.1:7777");  // never dialled here
  agent.registration.set_model_id("tiny");
  absl::Notification accepted;
  agent.on_accepted = [&](bool ok) {
    if (ok && !accepted.HasBeenNotified()) accepted.Notify();
  };
  worker.StartAgent(std::move(agent));
  ASSERT_TRUE(accepted.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(router.decode_pool().size(), 1);

  std::mt19937 rng(5);
  for (int r = 0; r < 6; ++r) {
    std::vector<int32_t> prompt;
    for (int i = 0; i < 40 + 9 * r; ++i) prompt.push_back(static_cast<int32_t>(rng() % 128));
    Run(loop, testing::GreedyRequest("a" + std::to_string(r), prompt, 2));
  }
  const std::vector<uint64_t> indexed = Indexed(loop);
  ASSERT_FALSE(indexed.empty());
  EXPECT_TRUE(testing::Eventually(
      [&] { return Sorted(router.decode_pool().KnownBlocks("127.0.0.1:7777")) == indexed; }));
  // The agent's metrics thread publishes the role's gauges.
  EXPECT_TRUE(testing::Eventually([&] {
    return metrics.Serialize().find("tandem_kv_cache_usage_ratio{role=\"decode\"}") !=
           std::string::npos;
  }));
  worker.StopAgent();
  server->Shutdown(std::chrono::system_clock::now());
}

}  // namespace
}  // namespace tandem::router
