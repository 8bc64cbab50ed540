#include "router/request_queue.h"

#include "absl/strings/str_cat.h"

namespace tandem::router {

absl::Status RequestQueue::Admit(int64_t tokens) {
  absl::MutexLock lock(&mu_);
  if (counts_.waiting >= limits_.max_queued_requests) {
    return absl::ResourceExhaustedError(
        absl::StrCat(counts_.waiting,
                     " requests are already waiting (router.max_queued_requests); retry later"));
  }
  if (counts_.waiting_tokens + tokens > limits_.max_queued_tokens) {
    return absl::ResourceExhaustedError(absl::StrCat(counts_.waiting_tokens,
                                                     " prompt tokens are already waiting; ", tokens,
                                                     " more would pass router.max_queued_tokens (",
                                                     limits_.max_queued_tokens, "); retry later"));
  }
  ++counts_.waiting;
  counts_.waiting_tokens += tokens;
  Publish();
  return absl::OkStatus();
}

void RequestQueue::StartRunning(int64_t tokens) {
  absl::MutexLock lock(&mu_);
  --counts_.waiting;
  counts_.waiting_tokens -= tokens;
  ++counts_.running;
  Publish();
}

void RequestQueue::Leave(bool running, int64_t tokens) {
  absl::MutexLock lock(&mu_);
  if (running) {
    --counts_.running;
  } else {
    --counts_.waiting;
    counts_.waiting_tokens -= tokens;
  }
  Publish();
}

RequestQueue::Counts RequestQueue::counts() const {
  absl::MutexLock lock(&mu_);
  return counts_;
}

void RequestQueue::Publish() {
  if (waiting_gauge_ != nullptr) waiting_gauge_->Set(static_cast<double>(counts_.waiting));
  if (running_gauge_ != nullptr) running_gauge_->Set(static_cast<double>(counts_.running));
}

}  // namespace tandem::router
