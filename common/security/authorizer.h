// Which role may call which internal method (DESIGN.md, "Security"), and the check every
// internal handler runs first. Only prefill workers put blocks into the store; prefill and decode
// workers read them; only workers register with the router; only the router calls workers.
// Over plaintext there are no identities and every call is allowed (loopback, or an operator's
// explicit `security.allow_insecure`).
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string_view>

#include "common/metrics/metrics.h"
#include "common/security/transport.h"

namespace tandem::security {

class Authorizer {
 public:
  // `metrics` may be null (no counting); it must outlive the authorizer.
  Authorizer(std::shared_ptr<const Transport> transport, metrics::Metrics* metrics);
  // Plaintext: allows every call.
  static const Authorizer& Open();

  // OK when the peer's role may call `method` (a full name, "/tandem.v1.CacheStore/Put") or the
  // transport is plaintext; otherwise PERMISSION_DENIED, logged with the peer's identity (never
  // the request) and counted in tandem_auth_denied_total.
  grpc::Status Check(grpc::ServerContextBase& context, std::string_view method) const;
  // A unary handler's refusal: the context's reactor finished with Check's error, or null
  // when the call is allowed.
  grpc::ServerUnaryReactor* DenyUnary(grpc::CallbackServerContext* context,
                                      std::string_view method) const;

  // The roles that may call `method`; none for a method this table does not know.
  static Roles AllowedRoles(std::string_view method);

 private:
  std::shared_ptr<const Transport> transport_;
  metrics::Metrics* metrics_;
};

// A streaming handler's answer to a call it refuses: finishes with `status` at once.
template <typename Reactor>
Reactor* Refuse(grpc::Status status) {
  class Refused final : public Reactor {
   public:
    explicit Refused(grpc::Status s) { this->Finish(std::move(s)); }
    void OnDone() override { delete this; }
  };
  return new Refused(std::move(status));
}

}  // namespace tandem::security
