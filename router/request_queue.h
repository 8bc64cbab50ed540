// The router's admission counters: requests admitted and waiting for their first decode output,
// and requests streaming from a decode worker. Admit refuses past the queue limits. Exports
// tandem_requests_waiting / tandem_requests_running for the router role. Thread-safe; a leaf
// (calls out to nothing but its gauges).
#pragma once

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "prometheus/gauge.h"

namespace tandem::router {

struct RequestQueueLimits {
  int max_queued_requests = 1024;
  int64_t max_queued_tokens = 1 << 20;
};

class RequestQueue {
 public:
  // Gauges may be null (no export).
  RequestQueue(const RequestQueueLimits& limits, prometheus::Gauge* waiting,
               prometheus::Gauge* running)
      : limits_(limits), waiting_gauge_(waiting), running_gauge_(running) {}

  // RESOURCE_EXHAUSTED past the limits; otherwise the request (of `tokens` prompt tokens) waits.
  absl::Status Admit(int64_t tokens);
  void StartRunning(int64_t tokens);  // waiting -> running
  // The request ended, waiting or running.
  void Leave(bool running, int64_t tokens);

  struct Counts {
    int64_t waiting = 0;
    int64_t waiting_tokens = 0;
    int64_t running = 0;
  };
  Counts counts() const;

 private:
  void Publish() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const RequestQueueLimits limits_;
  prometheus::Gauge* const waiting_gauge_;
  prometheus::Gauge* const running_gauge_;
  mutable absl::Mutex mu_;
  Counts counts_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::router
