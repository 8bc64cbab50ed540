// Where one request's responses go: the front door it came in by (gRPC or HTTP). CallState
// produces the same tandem.v1 events whichever door it serves; each door translates them.
#pragma once

#include <grpcpp/support/status.h>

#include <functional>
#include <vector>

#include "tandem/v1/inference.pb.h"

namespace tandem::router {

class ResponseSink {
 public:
  virtual ~ResponseSink() = default;
  // One event of the stream, in order: chunks, then one complete. CallState calls it under its
  // own lock (the lock is what keeps the order), so it must only queue: never block, never call
  // back into the call. Work that must not run under that lock (starting other calls, say)
  // goes into `after_unlock`, which the call runs once it has released it.
  virtual void Push(const tandem::v1::GenerateResponse& response,
                    std::vector<std::function<void()>>& after_unlock) = 0;
  // The end, once: OK after the complete, or the error that ended the request. Called with no
  // lock held.
  virtual void End(const grpc::Status& status) = 0;
};

}  // namespace tandem::router
