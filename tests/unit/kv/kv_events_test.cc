// The prefix index's event log: numbering, reading from a point, and the answer "too old" once
// the events asked for were dropped.
#include "common/kv/kv_events.h"

#include <gtest/gtest.h>

namespace tandem::kv {
namespace {

TEST(KvEventLogTest, EventsAreNumberedAndReadFromAnyKeptPoint) {
  KvEventLog log(4);
  EXPECT_EQ(log.next_seq(), 0u);
  std::vector<KvEvent> out;
  EXPECT_TRUE(log.Since(0, &out));
  EXPECT_TRUE(out.empty());
  log.Stored(10);
  log.Stored(11);
  log.Removed(10);
  EXPECT_EQ(log.next_seq(), 3u);
  ASSERT_TRUE(log.Since(1, &out));
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].seq, 1u);
  EXPECT_EQ(out[0].hash, 11u);
  EXPECT_FALSE(out[0].removed);
  EXPECT_EQ(out[1].hash, 10u);
  EXPECT_TRUE(out[1].removed);
  out.clear();
  EXPECT_TRUE(log.Since(3, &out));  // up to date
  EXPECT_TRUE(out.empty());
}

TEST(KvEventLogTest, AReaderPastTheKeptEventsMustResync) {
  KvEventLog log(4);
  for (uint64_t h = 0; h < 10; ++h) log.Stored(h);  // keeps 6..9
  std::vector<KvEvent> out;
  EXPECT_FALSE(log.Since(5, &out));
  EXPECT_TRUE(out.empty());
  ASSERT_TRUE(log.Since(6, &out));
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(out.front().hash, 6u);
  EXPECT_EQ(out.back().seq, 9u);
}

}  // namespace
}  // namespace tandem::kv
