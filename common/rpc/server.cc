#include "common/rpc/server.h"

#include <arpa/inet.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <netinet/in.h>

#include <algorithm>
#include <climits>
#include <mutex>

#include "absl/strings/str_cat.h"

namespace tandem::rpc {

absl::StatusOr<StartedServer> StartServer(const std::string& listen,
                                          const std::vector<grpc::Service*>& services,
                                          const std::vector<std::string>& service_names,
                                          const ServerOptions& options) {
  static std::once_flag once;
  std::call_once(once, [] {
    grpc::EnableDefaultHealthCheckService(true);
    grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  });
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("listen address \"", listen, "\" is not host:port"));
  }
  grpc::ServerBuilder builder;
  // Peers probe idle connections with HTTP/2 pings to find hung processes (a stopped process's
  // kernel still acknowledges TCP, so only a ping answered by gRPC proves it alive). By default
  // servers answer pings more often than every 5 minutes with GOAWAY; accept them every second.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 1000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  // A peer that connects and says nothing is let go.
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, 10000);
  if (options.max_receive_bytes > 0) {
    builder.SetMaxReceiveMessageSize(
        static_cast<int>(std::min<int64_t>(options.max_receive_bytes, INT32_MAX)));
  }
  const security::Transport& transport =
      options.transport != nullptr ? *options.transport : *security::Transport::Insecure();
  int port = 0;
  builder.AddListeningPort(listen, transport.ServerCredentials(options.clients), &port);
  for (grpc::Service* s : services) builder.RegisterService(s);
  StartedServer started;
  started.server = builder.BuildAndStart();
  if (started.server == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", listen));
  }
  started.address = absl::StrCat(listen.substr(0, colon), ":", port);
  SetServing(*started.server, service_names, false);
  return started;
}

void SetServing(grpc::Server& server, const std::vector<std::string>& service_names, bool serving) {
  grpc::HealthCheckServiceInterface* health = server.GetHealthCheckService();
  if (health == nullptr) return;
  health->SetServingStatus(serving);
  SetServicesServing(server, service_names, serving);
}

void SetServicesServing(grpc::Server& server, const std::vector<std::string>& service_names,
                        bool serving) {
  grpc::HealthCheckServiceInterface* health = server.GetHealthCheckService();
  if (health == nullptr) return;
  for (const std::string& name : service_names) health->SetServingStatus(name, serving);
}

std::string AdvertisedAddress(std::string_view advertise, std::string_view bound) {
  if (advertise.empty()) return std::string(bound);
  const std::string host(advertise);
  const size_t colon = bound.rfind(':');
  const std::string port(colon == std::string_view::npos ? "" : bound.substr(colon));
  in6_addr v6;
  if (inet_pton(AF_INET6, host.c_str(), &v6) == 1) return absl::StrCat("[", host, "]", port);
  if (host.find(':') == std::string::npos) return host + port;
  return host;
}

}  // namespace tandem::rpc
