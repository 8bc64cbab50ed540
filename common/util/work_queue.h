// A few threads running queued tasks in order of submission: blocking I/O (store uploads, RPCs
// to other workers) that must stay off an engine's step loop. The destructor runs every task
// already queued, then joins.
#pragma once

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace tandem {

class WorkQueue {
 public:
  explicit WorkQueue(int num_threads);
  ~WorkQueue();
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  void Submit(std::function<void()> task);

 private:
  void Run();

  absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace tandem
