// The write side of a server-streaming call when messages are produced on other threads (an
// engine loop, a client callback) faster than gRPC may write them. Messages queue here; one
// write is outstanding at a time; End() finishes the call once the queue has drained.
//
// The queue is shared (std::shared_ptr) by the reactor and every producer, so producers may
// outlive the reactor: after Finish nothing touches it again (`finished`), and the reactor's
// OnDone follows Finish.
#pragma once

#include <grpcpp/grpcpp.h>

#include <deque>
#include <optional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace tandem::rpc {

template <typename Message>
class ServerStream {
 public:
  explicit ServerStream(grpc::ServerWriteReactor<Message>* reactor) : reactor_(reactor) {}

  // Queues `message`; dropped once the call is ending.
  void Push(Message message) {
    {
      absl::MutexLock lock(&mu_);
      if (finished_ || end_.has_value()) return;
      queue_.push_back(std::move(message));
    }
    Pump();
  }

  // Finishes with `status` after the queued messages are written (the first End wins).
  void End(grpc::Status status) {
    {
      absl::MutexLock lock(&mu_);
      if (!end_.has_value()) end_ = std::move(status);
    }
    Pump();
  }

  // Call from the reactor's OnWriteDone.
  void WriteDone(bool ok) {
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      queue_.pop_front();
      if (!ok) {
        if (!end_.has_value()) end_ = grpc::Status(grpc::StatusCode::CANCELLED, "client gone");
        queue_.clear();
      }
    }
    Pump();
  }

  bool ending() const {
    absl::MutexLock lock(&mu_);
    return end_.has_value();
  }

 private:
  // Starts the next write, or finishes once nothing is left. The reactor calls happen outside
  // the lock; `writing_` and `finished_` make each happen once.
  void Pump() {
    const Message* next = nullptr;
    std::optional<grpc::Status> finish;
    {
      absl::MutexLock lock(&mu_);
      if (writing_ || finished_) return;
      if (!queue_.empty()) {
        writing_ = true;
        next = &queue_.front();  // deque: stable while others push_back
      } else if (end_.has_value()) {
        finished_ = true;
        finish = *end_;
      }
    }
    if (next != nullptr) reactor_->StartWrite(next);
    if (finish.has_value()) reactor_->Finish(*finish);
  }

  grpc::ServerWriteReactor<Message>* const reactor_;  // valid until Finish
  mutable absl::Mutex mu_;
  std::deque<Message> queue_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<grpc::Status> end_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::rpc
