// Each Tandem role built from the configuration and served on its own gRPC server: a cache-store
// shard, a prefill worker, a decode worker and the router. `tandem serve` starts all of them in
// one process (on loopback, through the same gRPC code paths as a deployment); `tandem router`,
// `tandem prefill`, `tandem decode` and `tandem cache-store` start one.
//
// Destroying a role stops it: its server shuts down (calls in flight end), then its engine.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/config/config.h"
#include "common/engine/compute_share.h"
#include "common/metrics/metrics.h"
#include "common/security/transport.h"

namespace tandem::cli {

class Role {
 public:
  virtual ~Role() = default;
  // host:port the role serves on (port 0 resolved).
  virtual const std::string& address() const = 0;
  // host:port of the role's HTTP front door; empty without one.
  virtual std::string http_address() const { return ""; }
  // Health NOT_SERVING and, for the router, new requests UNAVAILABLE; calls in flight go on.
  virtual void Drain() = 0;
};

// The id every block hash of this model is seeded with: the served name, so that every role of
// one deployment agrees on it.
std::string ModelId(const config::TandemConfig& config);

// The grpc.health.v1 service names a role serves ("router", "prefill", "decode",
// "cache-store").
std::vector<std::string> HealthNames(const std::string& role);

// How `role` ("router", "prefill", "decode", "cache-store") of this configuration talks to the
// others: mutual TLS when security.tls is set (its certificate must name `role`), else
// plaintext. Fails closed first: a listener of the role beyond loopback without TLS is refused
// unless security.allow_insecure. The router's HTTP door serves HTTPS with the same certificate.
// `metrics` (may be null; must outlive the transport) counts the handshakes its servers refuse.
absl::StatusOr<std::shared_ptr<const security::Transport>> RoleTransport(
    const config::TandemConfig& config, const std::string& role,
    metrics::Metrics* metrics = nullptr);

// `metrics` must outlive the role. A worker given `share` (which must outlive it) computes on
// the process's shared pool, a step per turn; without one it has model.threads of its own.
absl::StatusOr<std::unique_ptr<Role>> StartCacheStore(const config::TandemConfig& config,
                                                      metrics::Metrics& metrics);
absl::StatusOr<std::unique_ptr<Role>> StartPrefill(const config::TandemConfig& config,
                                                   engine::ComputeShare* share,
                                                   metrics::Metrics& metrics);
absl::StatusOr<std::unique_ptr<Role>> StartDecode(const config::TandemConfig& config,
                                                  engine::ComputeShare* share,
                                                  metrics::Metrics& metrics);
// `workers_in_process`: the workers are `tandem serve`'s own, on loopback without TLS; the
// router's public port still takes security.tls.
absl::StatusOr<std::unique_ptr<Role>> StartRouter(const config::TandemConfig& config,
                                                  metrics::Metrics& metrics,
                                                  bool workers_in_process = false);

}  // namespace tandem::cli
