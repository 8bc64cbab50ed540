// The balancer's prefill pacing through the whole router over real gRPC (issue 17): with the
// balancer engaged on a driven clock and the prefill workers held at a gate, requests past
// `max_prefill_ahead_bytes` wait in the pacer. Cancels, deadlines and the balancer disengaging
// while they wait must end with no hang, the ledger back at 0, and every other request served.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "router/router_service.h"
#include "tests/unit/router/router_cluster.h"
#include "tests/unit/testing/eventually.h"
#include "tests/unit/testing/manual_time.h"

namespace tandem::router {
namespace {

using testing::Eventually;
using testing::Result;

constexpr int kBlockBytes = 8192;  // the fixture's kv_bytes_per_block
constexpr int kPromptTokens = 40;  // two full blocks of 16
constexpr int kMaxTokens = 4;

// A request streaming on its own thread, with its own context to cancel.
struct Pending {
  grpc::ClientContext context;
  Result result;
  std::thread thread;
};

class RouterPacingTest : public testing::RouterClusterTest {
 protected:
  // A router whose pacer lets one prompt (two blocks) ahead of decode, with the balancer engaged
  // (one lookup, a miss) and the prefill workers held.
  void StartPaced() {
    RouterOptions options;
    options.max_prefill_ahead_bytes = 3 * kBlockBytes;
    options.balancer.min_lookups = 1;
    options.clock = &clock_;
    StartCluster(64 << 20, options);
    router_->balancer().RecordLookups(0, 1, clock_.Now());
    ASSERT_TRUE(router_->balancer().engaged(clock_.Now()));
    GatePrefill();
  }

  // A whole window of hits, a window after engaging: the balancer lets go.
  void Disengage() {
    clock_.Advance(RouterOptions().balancer.window + std::chrono::seconds(1));
    router_->balancer().RecordLookups(100, 0, clock_.Now());
    ASSERT_FALSE(router_->balancer().engaged(clock_.Now()));
  }

  std::unique_ptr<Pending> Send(int salt, std::chrono::milliseconds timeout) {
    auto p = std::make_unique<Pending>();
    p->context.set_deadline(std::chrono::system_clock::now() + timeout);
    p->thread = std::thread([this, p = p.get(), salt] {
      p->result = Read(p->context, Request(Prompt(kPromptTokens, salt), kMaxTokens));
    });
    return p;
  }
  std::unique_ptr<Pending> Send(int salt) { return Send(salt, std::chrono::seconds(60)); }

  // Request 1: with nothing ahead it is admitted at once (its two blocks counted), then held at
  // the prefill gate, so the next ones wait in the pacer.
  std::unique_ptr<Pending> SendFirst() {
    auto first = Send(1);
    EXPECT_TRUE(Eventually([&] { return router_->pacer().ahead_bytes() == 2 * kBlockBytes; }));
    return first;
  }

  bool PacedAre(int n) {
    return Eventually([&] { return router_->GetLoad().paced == n; });
  }

  // Ends with the pacer empty, nothing counted, and every block back.
  void ExpectAllReleased() {
    EXPECT_TRUE(Eventually([&] {
      return router_->pacer().ahead_bytes() == 0 && router_->GetLoad().paced == 0 &&
             AllBlocksFree();
    })) << "ahead "
        << router_->pacer().ahead_bytes() << ", paced " << router_->GetLoad().paced;
  }

  void ExpectServed(Pending& p, int salt) {
    p.thread.join();
    ASSERT_TRUE(p.result.status.ok()) << salt << ": " << p.result.status.error_message();
    EXPECT_EQ(p.result.tokens, Expected(Prompt(kPromptTokens, salt), kMaxTokens)) << salt;
  }

  testing::ManualTimeSource clock_;
};

TEST_F(RouterPacingTest, CancelAndDeadlineWhilePacedCostTheLedgerNothing) {
  StartPaced();
  auto first = SendFirst();
  auto cancelled = Send(2);
  ASSERT_TRUE(PacedAre(1));  // one at a time, so the queue's order is known
  auto expiring = Send(3, std::chrono::milliseconds(1500));
  ASSERT_TRUE(PacedAre(2));
  auto waiting = Send(4);
  ASSERT_TRUE(PacedAre(3));

  cancelled->context.TryCancel();
  cancelled->thread.join();
  EXPECT_EQ(cancelled->result.status.error_code(), grpc::StatusCode::CANCELLED);
  expiring->thread.join();
  EXPECT_EQ(expiring->result.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  // Both left the queue; neither released room it never held, so the last one still waits.
  EXPECT_TRUE(PacedAre(1));
  EXPECT_EQ(router_->pacer().ahead_bytes(), 2 * kBlockBytes);

  OpenPrefill();
  ExpectServed(*first, 1);
  ExpectServed(*waiting, 4);
  ExpectAllReleased();
}

// The wedge reproduced in issue 17: a paced request cancelled after the balancer disengaged
// used to start its own prefill under its own lock and hang the router thread.
TEST_F(RouterPacingTest, CancelAfterTheBalancerDisengagesDoesNotWedgeTheRouter) {
  StartPaced();
  auto first = SendFirst();
  auto cancelled = Send(2);
  ASSERT_TRUE(PacedAre(1));
  auto waiting = Send(3);
  ASSERT_TRUE(PacedAre(2));
  Disengage();

  cancelled->context.TryCancel();
  cancelled->thread.join();
  EXPECT_EQ(cancelled->result.status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(PacedAre(0));  // its leaving let the other one through, not itself
  OpenPrefill();
  ExpectServed(*first, 1);
  ExpectServed(*waiting, 3);
  auto later = Send(5);  // the router still serves
  ExpectServed(*later, 5);
  ExpectAllReleased();
}

TEST_F(RouterPacingTest, PacedRequestsGoOnceTheBalancerDisengages) {
  StartPaced();
  auto first = SendFirst();
  auto waiting = Send(2);
  ASSERT_TRUE(PacedAre(1));
  router_->PollPacing();  // still engaged: nothing moves
  EXPECT_EQ(router_->GetLoad().paced, 1);
  Disengage();
  router_->PollPacing();  // what the registry does every heartbeat interval
  EXPECT_EQ(router_->GetLoad().paced, 0);
  EXPECT_EQ(router_->pacer().ahead_bytes(), 4 * kBlockBytes);
  OpenPrefill();
  ExpectServed(*first, 1);
  ExpectServed(*waiting, 2);
  ExpectAllReleased();
}

TEST_F(RouterPacingTest, ManyPacedRequestsWithRandomCancels) {
  StartPaced();
  auto first = SendFirst();
  constexpr int kRequests = 12;
  std::vector<std::unique_ptr<Pending>> pending;
  for (int i = 0; i < kRequests; ++i) {
    pending.push_back(Send(10 + i));
    ASSERT_TRUE(PacedAre(i + 1));
  }
  std::mt19937 rng(17);
  std::vector<bool> cancel(kRequests);
  for (int i = 0; i < kRequests; ++i) cancel[i] = rng() % 3 == 0;
  cancel[kRequests / 2] = true;  // at least one
  // Half the cancels before the gate opens, half while the rest drain, one after disengaging.
  for (int i = 0; i < kRequests / 2; ++i) {
    if (cancel[i]) pending[i]->context.TryCancel();
  }
  OpenPrefill();
  for (int i = kRequests / 2; i < kRequests; ++i) {
    if (i == kRequests - 2) Disengage();
    if (cancel[i]) pending[i]->context.TryCancel();
  }
  ExpectServed(*first, 1);
  for (int i = 0; i < kRequests; ++i) {
    if (!cancel[i]) {
      ExpectServed(*pending[i], 10 + i);
      continue;
    }
    pending[i]->thread.join();
    // A cancel can land after the request already finished.
    const grpc::StatusCode code = pending[i]->result.status.error_code();
    EXPECT_TRUE(code == grpc::StatusCode::CANCELLED || code == grpc::StatusCode::OK) << i;
  }
  ExpectAllReleased();
}

}  // namespace
}  // namespace tandem::router
