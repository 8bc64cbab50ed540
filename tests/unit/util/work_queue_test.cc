#include "common/util/work_queue.h"

#include <gtest/gtest.h>

#include <atomic>
#include <set>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace tandem {
namespace {

TEST(WorkQueueTest, RunsEveryTaskOnItsThreads) {
  std::atomic<int> done{0};
  std::set<std::thread::id> ids;
  absl::Mutex mu;
  {
    WorkQueue q(3);
    for (int i = 0; i < 200; ++i) {
      q.Submit([&] {
        absl::MutexLock lock(&mu);
        ids.insert(std::this_thread::get_id());
        ++done;
      });
    }
  }  // the destructor drains the queue
  EXPECT_EQ(done.load(), 200);
  EXPECT_FALSE(ids.contains(std::this_thread::get_id()));
  EXPECT_LE(ids.size(), 3u);
}

TEST(WorkQueueTest, TasksMaySubmitTasks) {
  absl::Notification second;
  WorkQueue q(1);
  q.Submit([&] { q.Submit([&] { second.Notify(); }); });
  EXPECT_TRUE(second.WaitForNotificationWithTimeout(absl::Seconds(30)));
}

}  // namespace
}  // namespace tandem
