// Every Tandem gRPC server is built here, so each process gets the same extras: the standard
// grpc.health.v1.Health service (overall and per service name, NOT_SERVING until the caller
// marks itself ready and again while draining) and server reflection.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::rpc {

struct StartedServer {
  std::unique_ptr<grpc::Server> server;
  std::string address;  // host:port actually bound (port 0 resolved)
};

// Binds `listen` ("host:port", port 0 picks one) and serves `services`. Health starts
// NOT_SERVING for the server and for each service name.
absl::StatusOr<StartedServer> StartServer(const std::string& listen,
                                          const std::vector<grpc::Service*>& services,
                                          const std::vector<std::string>& service_names);

// Sets the health of the server ("") and of every name in `service_names`.
void SetServing(grpc::Server& server, const std::vector<std::string>& service_names,
                bool serving);

}  // namespace tandem::rpc
