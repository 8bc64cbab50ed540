#include "common/security/authorizer.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/util/log.h"

namespace tandem::security {
namespace {

struct Rule {
  std::string_view method;
  Roles roles;
};

constexpr Roles kWorkers = Role::kPrefill | Role::kDecode;

// Every internal method. A method missing here is refused to everyone once TLS is on, and
// tests/unit/security/authorizer_test.cc fails for any method of an internal service this table
// does not name.
constexpr Rule kRules[] = {
    {"/tandem.v1.CacheStore/Put", Role::kPrefill},
    {"/tandem.v1.CacheStore/ReserveShm", Role::kPrefill},
    {"/tandem.v1.CacheStore/CommitShm", Role::kPrefill},
    {"/tandem.v1.CacheStore/Get", kWorkers},
    {"/tandem.v1.CacheStore/AcquireShm", kWorkers},
    {"/tandem.v1.CacheStore/ReleaseShm", kWorkers},
    {"/tandem.v1.CacheStore/Exists", kWorkers},
    {"/tandem.v1.CacheStore/AttachSharedMemory", kWorkers},
    {"/tandem.v1.CacheStore/AttachFabric", kWorkers},
    {"/tandem.v1.CacheStore/GetStats", Role::kRouter | kWorkers},
    {"/tandem.v1.PrefillWorker/Prefill", Role::kRouter},
    {"/tandem.v1.DecodeWorker/Decode", Role::kRouter},
    {"/tandem.v1.Registry/Register", kWorkers},
    {"/tandem.v1.Registry/Heartbeat", kWorkers},
};

}  // namespace

Authorizer::Authorizer(std::shared_ptr<const Transport> transport, metrics::Metrics* metrics)
    : transport_(std::move(transport)), metrics_(metrics) {}

const Authorizer& Authorizer::Open() {
  static const Authorizer* open = new Authorizer(Transport::Insecure(), nullptr);
  return *open;
}

Roles Authorizer::AllowedRoles(std::string_view method) {
  for (const Rule& r : kRules) {
    if (r.method == method) return r.roles;
  }
  return Roles();
}

grpc::Status Authorizer::Check(grpc::ServerContextBase& context, std::string_view method) const {
  if (!transport_->tls()) return grpc::Status::OK;
  const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  const std::optional<Role> role = transport_->PeerRole(*auth);
  const Roles allowed = AllowedRoles(method);
  if (role.has_value() && allowed.Has(*role)) return grpc::Status::OK;
  const char* reason = role.has_value() ? "role" : "no_certificate";
  const std::string peer = Transport::PeerName(*auth, context.peer());
  Log(LogLevel::kWarning, "security",
      absl::StrCat("refused ", std::string(method), " to ", peer, ": ",
                   role.has_value() ? absl::StrCat("role ", RoleName(*role), " may not call it")
                                    : std::string("it has no role certificate"),
                   " (allowed: ", allowed.ToString(), ")"));
  if (metrics_ != nullptr) metrics_->AuthDenied(std::string(method), reason)->Increment();
  return grpc::Status(
      grpc::StatusCode::PERMISSION_DENIED,
      absl::StrCat(std::string(method), " is for ", allowed.ToString(), "; this peer is ",
                   role.has_value() ? RoleName(*role) : "unauthenticated"));
}

grpc::ServerUnaryReactor* Authorizer::DenyUnary(grpc::CallbackServerContext* context,
                                                std::string_view method) const {
  grpc::Status status = Check(*context, method);
  if (status.ok()) return nullptr;
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(std::move(status));
  return reactor;
}

}  // namespace tandem::security
