// The write side of a server-streaming call when messages are produced on other threads (an
// engine loop, a client callback) faster than gRPC may write them. Messages queue here; one
// write is outstanding at a time; End() finishes the call once the queue has drained.
//
// The queue is shared (std::shared_ptr) by the reactor and every producer, so producers may
// outlive the reactor: after Finish nothing touches it again (`finished`), and the reactor's
// OnDone follows Finish.
//
// A client that stops reading leaves a write outstanding (HTTP/2 flow control): PinIfStalled
// finds such a write, and holds the call from finishing (so its context stays valid) while the
// caller cancels it.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
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

  // True, once, when a write has been outstanding for longer than `timeout` at `now` (the
  // client does not read); the call then cannot finish until Unpin, so the caller may cancel it
  // through its context. False once the call has finished, and after the first true (the
  // cancel takes a moment to reach the write).
  bool PinIfStalled(std::chrono::steady_clock::time_point now,
                    std::chrono::steady_clock::duration timeout) {
    absl::MutexLock lock(&mu_);
    if (finished_ || stalled_ || !writing_ || now - write_started_ <= timeout) return false;
    stalled_ = true;
    ++pins_;
    return true;
  }
  void Unpin() {
    {
      absl::MutexLock lock(&mu_);
      --pins_;
    }
    Pump();
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
        write_started_ = std::chrono::steady_clock::now();
        next = &queue_.front();  // deque: stable while others push_back
      } else if (end_.has_value() && pins_ == 0) {
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
  std::chrono::steady_clock::time_point write_started_ ABSL_GUARDED_BY(mu_);
  int pins_ ABSL_GUARDED_BY(mu_) = 0;  // PinIfStalled callers still using the call
  bool stalled_ ABSL_GUARDED_BY(mu_) = false;  // PinIfStalled has said so
};

}  // namespace tandem::rpc
