// The one place where absl::Status and grpc::Status meet (STYLE.md: map errors at the RPC edge
// in one function). Codes map one to one; messages pass through.
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace tandem::rpc {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace tandem::rpc
