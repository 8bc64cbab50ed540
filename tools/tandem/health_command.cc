// tandem health: a role's grpc.health.v1 status, for Kubernetes probes of ports that speak TLS
// (the kubelet's own gRPC probe speaks plaintext only). It connects with the pod's own
// certificate (security.tls of --config), so it needs nothing a probe could not have.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/security/transport.h"
#include "common/util/status_macros.h"
#include "tools/tandem/commands.h"

namespace tandem::cli {
namespace {

// grpc.health.v1.HealthCheckRequest{service}, in protobuf's wire format (field 1, bytes).
std::string EncodeRequest(const std::string& service) {
  if (service.empty()) return "";
  std::string out = "\x0a";
  for (size_t n = service.size();; n >>= 7) {
    if (n < 0x80) {
      out += static_cast<char>(n);
      break;
    }
    out += static_cast<char>((n & 0x7f) | 0x80);
  }
  return out + service;
}

// HealthCheckResponse.status (field 1, varint); 0 (UNKNOWN) when absent.
int DecodeStatus(const std::string& bytes) {
  if (bytes.size() >= 2 && bytes[0] == '\x08') return static_cast<unsigned char>(bytes[1]) & 0x7f;
  return 0;
}

const char* StatusName(int status) {
  switch (status) {
    case 1:
      return "SERVING";
    case 2:
      return "NOT_SERVING";
    case 3:
      return "SERVICE_UNKNOWN";
    default:
      return "UNKNOWN";
  }
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> Credentials(
    const config::TandemConfig& c) {
  const config::TlsConfig& tls = c.security.tls;
  if (tls.ca_file.empty()) return grpc::InsecureChannelCredentials();
  TANDEM_ASSIGN_OR_RETURN(
      auto transport, security::Transport::Create({.ca_file = tls.ca_file,
                                                   .cert_file = tls.cert_file,
                                                   .key_file = tls.key_file,
                                                   .role_uri_prefix = c.security.role_uri_prefix}));
  using security::Role;
  return transport->ChannelCredentials(Role::kRouter | Role::kPrefill | Role::kDecode |
                                       Role::kCacheStore);
}

}  // namespace

absl::Status RunHealth(const CliArgs& args) {
  TANDEM_RETURN_IF_ERROR(args.CheckKnown({"addr", "service", "config", "set", "timeout"}));
  TANDEM_ASSIGN_OR_RETURN(std::string addr, args.String("addr"));
  TANDEM_ASSIGN_OR_RETURN(config::TandemConfig c, EffectiveConfig(args));
  TANDEM_ASSIGN_OR_RETURN(double timeout, args.DoubleOr("timeout", 3));
  TANDEM_ASSIGN_OR_RETURN(auto credentials, Credentials(c));
  grpc::GenericStub stub(grpc::CreateChannel(addr, credentials));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(static_cast<int64_t>(timeout * 1000)));
  const std::string body = EncodeRequest(args.StringOr("service", ""));
  grpc::Slice slice(body);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  grpc::Status status;
  absl::Notification done;
  stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&](grpc::Status s) {
                   status = std::move(s);
                   done.Notify();
                 });
  done.WaitForNotification();
  if (!status.ok()) {
    return absl::UnavailableError(absl::StrCat(addr, ": ", status.error_message()));
  }
  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (response.Dump(&slices).ok()) {
    for (const grpc::Slice& s : slices)
      bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  const int serving = DecodeStatus(bytes);
  std::printf("%s\n", StatusName(serving));
  if (serving != 1) return absl::UnavailableError(absl::StrCat(addr, " is ", StatusName(serving)));
  return absl::OkStatus();
}

}  // namespace tandem::cli
