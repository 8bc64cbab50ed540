// Every Tandem gRPC server is built here, so each process gets the same extras: the standard
// grpc.health.v1.Health service (overall and per service name, NOT_SERVING until the caller
// marks itself ready and again while draining) and server reflection.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/security/transport.h"

namespace tandem::rpc {

struct StartedServer {
  std::unique_ptr<grpc::Server> server;
  std::string address;  // host:port actually bound (port 0 resolved)
};

struct ServerOptions {
  // Plaintext, or mutual TLS asking clients for certificates as `clients` says. Must outlive
  // the call only (the credentials keep what they need).
  const security::Transport* transport = nullptr;  // null: plaintext
  security::ClientCertificates clients = security::ClientCertificates::kRequire;
  int64_t max_receive_bytes = 0;  // largest request message; 0: gRPC's default (4 MiB)
};

// Binds `listen` ("host:port", port 0 picks one) and serves `services`. Health starts
// NOT_SERVING for the server and for each service name. A peer gets 10 s to finish its TLS
// handshake.
absl::StatusOr<StartedServer> StartServer(const std::string& listen,
                                          const std::vector<grpc::Service*>& services,
                                          const std::vector<std::string>& service_names,
                                          const ServerOptions& options = {});

// Sets the health of the server ("") and of every name in `service_names`.
void SetServing(grpc::Server& server, const std::vector<std::string>& service_names, bool serving);
// Sets the health of every name in `service_names` only, leaving the server's own ("").
void SetServicesServing(grpc::Server& server, const std::vector<std::string>& service_names,
                        bool serving);

// The address a worker registers with the router. `advertise` may be empty (the bound address),
// a host without a port (a name, an IPv4 address or a bare IPv6 literal such as a Kubernetes pod
// IP: the bound port is added, an IPv6 literal gets brackets), or host:port as it is. A bare IPv6
// literal always counts as a host, so give an IPv6 address with a port in brackets.
std::string AdvertisedAddress(std::string_view advertise, std::string_view bound);

}  // namespace tandem::rpc
