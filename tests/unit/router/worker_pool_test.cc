// Worker choice: prefill by uncached prefix plus queued work, decode by resident prefix then
// load; failed workers back off, excluded ones are avoided while others remain; the registry's
// heartbeats feed the prefix index and silent workers leave rotation.
#include "router/worker_pool.h"

#include <gtest/gtest.h>

namespace tandem::router {
namespace {

std::vector<uint64_t> Hashes(std::initializer_list<uint64_t> h) { return h; }

class WorkerPoolTest : public ::testing::Test {
 protected:
  WorkerPoolTest() : pool_("decode", Options()) {
    pool_.Add("a:1");
    pool_.Add("b:1");
    a_first_ = pool_.PickDecode({}, {});
  }
  static WorkerPoolOptions Options() {
    WorkerPoolOptions o;
    o.block_size = 16;
    o.index_capacity = 8;
    o.failure_backoff = std::chrono::hours(1);
    return o;
  }
  std::string Name(Worker* w) { return w == nullptr ? "none" : w->address; }

  WorkerPool pool_;
  std::vector<uint64_t> prompt_ = {11, 12, 13, 14};
  Worker* a_first_ = nullptr;  // "a:1", to exclude it
};

TEST_F(WorkerPoolTest, TiesGoToTheFirstAndLoadSpreadsWork) {
  Worker* a = pool_.PickDecode(prompt_, {});
  EXPECT_EQ(Name(a), "a:1");
  pool_.Begin(a, 100, {});
  EXPECT_EQ(Name(pool_.PickDecode({}, {})), "b:1");
  EXPECT_EQ(Name(pool_.PickPrefill({}, {})), "b:1");
  pool_.End(a, 100);
  EXPECT_EQ(Name(pool_.PickPrefill({}, {})), "a:1");
}

TEST_F(WorkerPoolTest, ResidentPrefixWinsForDecodeEvenUnderLoad) {
  Worker* b = pool_.PickDecode({}, {a_first_});
  pool_.Begin(b, 10, prompt_);  // b now holds the prompt's blocks
  pool_.End(b, 10);
  pool_.Begin(b, 10, Hashes({99}));  // and is busier
  EXPECT_EQ(Name(pool_.PickDecode(prompt_, {})), "b:1");
  // Prefill weighs uncached blocks against queued tokens: 4 uncached blocks on a, 10/16 = 0
  // queued blocks on b.
  EXPECT_EQ(Name(pool_.PickPrefill(prompt_, {})), "b:1");
}

TEST_F(WorkerPoolTest, PrefillWorkCountsOnlyTheTokensPastTheHeldPrefix) {
  Worker* b = pool_.PickPrefill({}, {a_first_});
  EXPECT_EQ(pool_.Begin(b, 70, prompt_, /*uncached_only=*/true), 70);  // b knew nothing
  pool_.End(b, 70);
  // Again on b: its 4 blocks of 16 are held, so 6 tokens of work, not 70. Choices of one
  // prompt (n > 1) so stay on the worker that has their prefix: 6/16 = 0 queued blocks and
  // none uncached on b, against 4 uncached on a.
  EXPECT_EQ(pool_.Begin(b, 70, prompt_, /*uncached_only=*/true), 6);
  EXPECT_EQ(Name(pool_.PickPrefill(prompt_, {})), "b:1");
  // Without uncached_only every token counts (decode: the KV it holds).
  EXPECT_EQ(pool_.Begin(b, 70, prompt_), 70);
  pool_.End(b, 6);
  pool_.End(b, 70);
  EXPECT_EQ(Name(pool_.PickPrefill({}, {})), "a:1");  // b's load is gone: a tie again
}

TEST_F(WorkerPoolTest, FailedAndExcludedWorkersAreAvoidedWhileOthersRemain) {
  Worker* a = pool_.PickDecode({}, {});
  pool_.MarkFailed(a);
  EXPECT_EQ(pool_.available(), 1);
  Worker* b = pool_.PickDecode({}, {});
  EXPECT_EQ(Name(b), "b:1");
  // Everything failing or excluded: still an answer (a retry is better than none)...
  EXPECT_NE(pool_.PickDecode({}, {b}), nullptr);
  // ...but a removed worker is never chosen.
  pool_.Remove("a:1");
  pool_.Remove("b:1");
  EXPECT_EQ(pool_.PickDecode({}, {}), nullptr);
}

TEST_F(WorkerPoolTest, TheIndexForgetsTheLeastRecentBlocks) {
  Worker* a = pool_.PickDecode({}, {});
  std::vector<uint64_t> many = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};  // capacity 8
  pool_.Begin(a, 0, many);
  EXPECT_EQ(Name(pool_.PickDecode(Hashes({9, 10}), {})), "a:1");
  EXPECT_EQ(Name(pool_.PickDecode(Hashes({1, 2}), {a_first_})),
            "b:1");  // 1 and 2 were evicted: tie
}

TEST_F(WorkerPoolTest, HeartbeatsFeedTheIndexAndSilenceExpires) {
  WorkerPool pool("prefill", Options());
  const std::string id = pool.Register("c:1");
  EXPECT_FALSE(id.empty());
  EXPECT_EQ(pool.size(), 1);
  tandem::v1::WorkerLoad load;
  load.set_full_block_snapshot(true);
  for (uint64_t h : {21, 22}) load.add_new_block_hashes(h);
  EXPECT_TRUE(pool.Heartbeat(id, load).known);
  EXPECT_FALSE(pool.Heartbeat("prefill-999", load).known);
  const std::string id2 = pool.Register("d:1");
  // c holds both blocks: chosen for this prompt although d is idle too.
  EXPECT_EQ(Name(pool.PickPrefill(std::vector<uint64_t>{21, 22}, {})), "c:1");
  tandem::v1::WorkerLoad evicted;  // the event after the snapshot
  tandem::v1::KvEvent* e = evicted.add_kv_events();
  e->set_block_hash(21);
  e->set_removed(true);
  EXPECT_TRUE(pool.Heartbeat(id, evicted).known);
  EXPECT_EQ(Name(pool.PickPrefill(std::vector<uint64_t>{21, 22}, {})), "c:1");  // tie: first
  // d reports the prompt's blocks; c lost its first one.
  tandem::v1::WorkerLoad d_load;
  d_load.set_full_block_snapshot(true);
  d_load.add_new_block_hashes(21);
  d_load.add_new_block_hashes(22);
  EXPECT_TRUE(pool.Heartbeat(id2, d_load).known);
  EXPECT_EQ(Name(pool.PickPrefill(std::vector<uint64_t>{21, 22}, {})), "d:1");

  EXPECT_TRUE(pool.ExpireSilent(std::chrono::hours(1)).empty());
  const std::vector<std::string> expired = pool.ExpireSilent(std::chrono::seconds(-1));
  EXPECT_EQ(expired.size(), 2u);
  EXPECT_EQ(pool.available(), 0);
  EXPECT_FALSE(pool.Heartbeat(id, load).known);  // expired: must register again
  pool.Register("c:1");
  EXPECT_EQ(Name(pool.PickPrefill({}, {})), "c:1");
}

// Events apply in order after the snapshot; a heartbeat sent twice applies once; a gap (events
// the pool never saw) asks for a resync and drops what the pool knew until the next snapshot.
TEST_F(WorkerPoolTest, KvEventsApplyOnceAndAGapAsksForAResync) {
  WorkerPool pool("decode", Options());
  const std::string id = pool.Register("c:1");
  tandem::v1::WorkerLoad events;
  events.set_kv_events_first_seq(0);
  events.add_kv_events()->set_block_hash(5);
  EXPECT_TRUE(pool.Heartbeat(id, events).resync);  // no snapshot yet
  tandem::v1::WorkerLoad snapshot;
  snapshot.set_full_block_snapshot(true);
  snapshot.set_kv_events_first_seq(10);
  snapshot.add_new_block_hashes(1);
  EXPECT_FALSE(pool.Heartbeat(id, snapshot).resync);
  tandem::v1::WorkerLoad next;
  next.set_kv_events_first_seq(10);
  next.add_kv_events()->set_block_hash(2);
  tandem::v1::KvEvent* removed = next.add_kv_events();
  removed->set_block_hash(1);
  removed->set_removed(true);
  EXPECT_FALSE(pool.Heartbeat(id, next).resync);
  EXPECT_FALSE(pool.Heartbeat(id, next).resync);  // again: already applied
  EXPECT_EQ(pool.KnownBlocks("c:1"), std::vector<uint64_t>{2});
  tandem::v1::WorkerLoad gap;
  gap.set_kv_events_first_seq(13);  // 12 never arrived
  gap.add_kv_events()->set_block_hash(3);
  EXPECT_TRUE(pool.Heartbeat(id, gap).resync);
  EXPECT_TRUE(pool.KnownBlocks("c:1").empty());
}

TEST_F(WorkerPoolTest, WorkersGoneLongAreForgottenOnceIdle) {
  WorkerPoolOptions options = Options();
  options.forget_after = std::chrono::milliseconds(0);
  WorkerPool pool("prefill", options);
  pool.Register("old:1");
  pool.Register("new:1");
  Worker* old_worker = pool.PickPrefill({}, {});
  ASSERT_EQ(Name(old_worker), "old:1");
  pool.Begin(old_worker, 10, {});          // a call in flight keeps it
  EXPECT_TRUE(pool.ForgetGone().empty());  // nothing is gone yet
  pool.Remove("old:1");
  EXPECT_TRUE(pool.ForgetGone().empty());
  EXPECT_EQ(pool.size(), 2);
  pool.End(old_worker, 10);
  EXPECT_EQ(pool.ForgetGone(), std::vector<std::string>{"old:1"});
  EXPECT_EQ(pool.size(), 1);
  EXPECT_EQ(pool.ExpireSilent(std::chrono::seconds(-1)), std::vector<std::string>{"new:1"});
  EXPECT_EQ(pool.ForgetGone(), std::vector<std::string>{"new:1"});
  EXPECT_EQ(pool.size(), 0);
  // With the default (minutes), an expired worker stays, ready to register again.
  WorkerPool patient("prefill", Options());
  patient.Register("w:1");
  patient.ExpireSilent(std::chrono::seconds(-1));
  EXPECT_TRUE(patient.ForgetGone().empty());
  EXPECT_EQ(patient.size(), 1);
}

}  // namespace
}  // namespace tandem::router
