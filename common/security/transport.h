// How a Tandem process talks to the other roles (DESIGN.md, "Security"): plaintext, or mutual
// TLS with certificates from one cluster CA, each naming its role in a URI SAN
// (`spiffe://tandem/<role>`). The certificate files are watched and reloaded when they change
// (Kubernetes swaps a mounted Secret's symlink), so rotation needs no restart.
//
// A channel checks the server it reaches: its chain must lead to the CA and its role must be one
// the caller expects (a worker's channel to the store accepts only a cache store), so no host
// names are needed in certificates (workers are reached at pod IPs). Servers check a client's
// chain in the handshake and its role per call (Authorizer).
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace tandem::metrics {
class Metrics;
}

namespace tandem::security {

class CaBundle;

enum class Role : uint8_t { kRouter = 1, kPrefill = 2, kDecode = 4, kCacheStore = 8 };

// A set of roles.
class Roles {
 public:
  constexpr Roles() = default;
  constexpr Roles(Role r) : bits_(static_cast<uint8_t>(r)) {}  // NOLINT: a role is a set of one
  constexpr Roles operator|(Roles o) const { return Roles(bits_ | o.bits_); }
  constexpr bool Has(Role r) const { return (bits_ & static_cast<uint8_t>(r)) != 0; }
  constexpr bool empty() const { return bits_ == 0; }
  std::string ToString() const;  // "prefill|decode"

 private:
  constexpr explicit Roles(int bits) : bits_(static_cast<uint8_t>(bits)) {}
  uint8_t bits_ = 0;
};
constexpr Roles operator|(Role a, Role b) { return Roles(a) | Roles(b); }
constexpr Roles operator|(Role a, Roles b) { return Roles(a) | b; }

const char* RoleName(Role role);  // "router", "prefill", "decode", "cache_store"
std::optional<Role> ParseRole(std::string_view name);

struct TransportOptions {
  // PEM files; all three, or none (plaintext).
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
  // A certificate's role is the URI SAN that starts with this prefix, less the prefix.
  std::string role_uri_prefix = "spiffe://tandem/";
  int reload_seconds = 10;  // how often the files are checked for changes
  // Where servers count the clients their TLS handshake refuses (no certificate where one is
  // required, another CA's, an expired one): tandem_auth_denied_total{method="tls_handshake",
  // reason}. May be null.
  metrics::Metrics* metrics = nullptr;
};

// What a server asks of its clients' certificates.
enum class ClientCertificates {
  kRequire,   // internal ports: every peer is a role
  kOptional,  // the router's port: public clients need none, workers registering present theirs
};

class Transport {
 public:
  // Plaintext, no identities (loopback, tests, or `security.allow_insecure`).
  static std::shared_ptr<const Transport> Insecure();
  // Mutual TLS. Fails when a file cannot be read, holds no PEM, or the key does not match the
  // certificate, or when the certificate names no role, so a bad Secret fails at startup
  // rather than at the first connection.
  static absl::StatusOr<std::shared_ptr<const Transport>> Create(const TransportOptions& options);

  bool tls() const { return tls_; }
  // Servers verify a client's certificate chain themselves (against the CA file, re-read as it
  // changes), so each refusal is counted and logged with the certificate's identity; gRPC's own
  // check would fail the handshake unseen.
  std::shared_ptr<grpc::ServerCredentials> ServerCredentials(ClientCertificates clients) const;
  // For channels to servers of the given roles.
  std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials(Roles servers) const;
  // A peer's role as its verified certificate names it; nullopt without one (plaintext, or a
  // client that presented none) or when no URI SAN carries the prefix.
  std::optional<Role> PeerRole(const grpc::AuthContext& auth) const;
  // Who the peer is, for logs: its role URI, another SAN or CN, or "no certificate" and its
  // address.
  static std::string PeerName(const grpc::AuthContext& auth, const std::string& peer_address);
  // The role named by URI SANs (`uris`), under `prefix`.
  static std::optional<Role> RoleFromUris(const std::vector<std::string>& uris,
                                          std::string_view prefix);

  // This process's own role, from its certificate (TLS only).
  std::optional<Role> own_role() const { return own_role_; }

 private:
  Transport() = default;

  bool tls_ = false;
  TransportOptions options_;
  std::optional<Role> own_role_;
  std::shared_ptr<grpc::experimental::CertificateProviderInterface> provider_;
  std::shared_ptr<CaBundle> ca_;  // the servers' verification of client chains
};

// Whether `listen` ("host:port") binds only the loopback interface (127.0.0.0/8, ::1,
// localhost).
bool IsLoopbackListen(std::string_view listen);

// Fail closed: a listener (`key` names its configuration key) beyond loopback needs TLS, unless
// the operator allowed plaintext explicitly, which is logged as a warning.
absl::Status CheckListener(const std::string& key, const std::string& listen, bool tls,
                           bool allow_insecure);

}  // namespace tandem::security
