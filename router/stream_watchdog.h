// Cuts off gRPC clients that stop reading their stream. HTTP/2 flow control then holds the
// router's next write, the stream's messages pile up, and the call would last as long as the
// client keeps its connection open (its deadline, if it set one). The watchdog looks at every
// open Generate stream a few times per timeout and cancels those whose write has waited longer
// than the timeout (`router.grpc_write_timeout_seconds`); cancelling frees the request on its
// workers as a client's own cancel does.
//
// Threads: Watch from any thread; the sweeps run on the watchdog's own thread, holding its lock
// only to copy the list, never while cancelling.
#pragma once

#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"

namespace tandem::router {

// A stream the watchdog may cancel.
class WatchedStream {
 public:
  virtual ~WatchedStream() = default;
  // Cancels the call when a write has waited longer than `timeout` at `now`; true if it did.
  virtual bool CancelIfStalled(std::chrono::steady_clock::time_point now,
                               std::chrono::steady_clock::duration timeout) = 0;
};

class StreamWatchdog {
 public:
  // timeout 0: off (Watch ignores streams, no thread runs).
  explicit StreamWatchdog(std::chrono::steady_clock::duration timeout);
  ~StreamWatchdog();
  StreamWatchdog(const StreamWatchdog&) = delete;
  StreamWatchdog& operator=(const StreamWatchdog&) = delete;

  // Watches `stream` until it is gone (the watchdog holds it weakly).
  void Watch(std::weak_ptr<WatchedStream> stream) ABSL_LOCKS_EXCLUDED(mu_);
  // One pass, as the thread runs it: returns how many streams it cancelled.
  int Sweep(std::chrono::steady_clock::time_point now) ABSL_LOCKS_EXCLUDED(mu_);

  std::chrono::steady_clock::duration timeout() const { return timeout_; }

 private:
  void Loop();

  const std::chrono::steady_clock::duration timeout_;
  absl::Mutex mu_;
  std::vector<std::weak_ptr<WatchedStream>> streams_ ABSL_GUARDED_BY(mu_);
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace tandem::router
