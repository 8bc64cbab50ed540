// tandem serve and the single-role commands.
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/engine/compute_share.h"
#include "common/metrics/metrics.h"
#include "common/rpc/server.h"
#include "common/util/status_macros.h"
#include "tools/tandem/commands.h"
#include "tools/tandem/roles.h"
#include "tools/tandem/serve_layout.h"

namespace tandem::cli {
namespace {

constexpr char kLoopback[] = "127.0.0.1:0";

// Blocks SIGINT and SIGTERM in this thread and every thread started after it, so WaitForSignal
// receives them instead of the default handler killing the process mid-request.
sigset_t BlockStopSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  return set;
}

int WaitForSignal(const sigset_t& set) {
  int sig = 0;
  sigwait(&set, &sig);
  return sig;
}

absl::StatusOr<std::unique_ptr<metrics::MetricsServer>> StartMetrics(const config::TandemConfig& c,
                                                                     metrics::Metrics& metrics) {
  if (c.metrics.listen.empty()) return nullptr;
  return metrics::MetricsServer::Start(c.metrics.listen, metrics);
}

// What a role shows while it loads (a model can take minutes): a server with only
// grpc.health.v1 on its port, answering NOT_SERVING for its names, so probes see "not ready"
// rather than a refused connection; and SIGINT/SIGTERM stop the process at once, since there
// is nothing to drain yet. Done() hands both over: the role's own server already binds the same
// port (gRPC sets SO_REUSEPORT), and WaitForSignal takes the signals.
class Loading {
 public:
  // `listen` becomes the address the health server bound (port 0 resolved).
  static absl::StatusOr<std::unique_ptr<Loading>> Start(const std::string& what,
                                                        std::string& listen,
                                                        const std::vector<std::string>& names,
                                                        const security::Transport& transport,
                                                        const sigset_t& signals) {
    TANDEM_ASSIGN_OR_RETURN(rpc::StartedServer server,
                            rpc::StartServer(listen, {}, names,
                                             {.transport = &transport,
                                              .clients = security::ClientCertificates::kOptional}));
    listen = server.address;
    std::fprintf(stderr, "tandem %s: loading; health NOT_SERVING on %s\n", what.c_str(),
                 listen.c_str());
    return std::unique_ptr<Loading>(new Loading(what, std::move(server), signals));
  }
  ~Loading() { Done(); }

  void Done() {
    if (server_.server == nullptr) return;
    done_.store(true);
    watcher_.join();
    server_.server->Shutdown(std::chrono::system_clock::now());
    server_.server->Wait();
    server_.server.reset();
  }

 private:
  Loading(std::string what, rpc::StartedServer server, const sigset_t& signals)
      : server_(std::move(server)), watcher_([this, what = std::move(what), signals] {
          const timespec tick = {0, 100'000'000};
          while (!done_.load()) {
            const int sig = sigtimedwait(&signals, nullptr, &tick);
            if (sig > 0) {
              std::fprintf(stderr, "tandem %s: signal %d while loading, stopping\n", what.c_str(),
                           sig);
              std::_Exit(0);
            }
          }
        }) {}

  rpc::StartedServer server_;
  std::atomic<bool> done_{false};
  std::thread watcher_;
};

std::string MetricsUrl(const config::TandemConfig& c, const metrics::MetricsServer* server) {
  if (server == nullptr) return "off";
  const std::string host = c.metrics.listen.substr(0, c.metrics.listen.rfind(':'));
  return absl::StrCat("http://", host, ":", server->port(), "/metrics");
}

// The compute pool of `device`, with its turns counted in `metrics`.
std::unique_ptr<engine::ComputeShare> MakeShare(const std::string& device, int threads,
                                                metrics::Metrics& metrics) {
  const metrics::Metrics::ComputeTurn decode = metrics.ComputeTurns(device, "decode");
  const metrics::Metrics::ComputeTurn prefill = metrics.ComputeTurns(device, "prefill");
  return std::make_unique<engine::ComputeShare>(
      threads, [decode, prefill](engine::Phase phase, double wait_seconds) {
        const auto& m = phase == engine::Phase::kDecode ? decode : prefill;
        m.turns->Increment();
        m.wait_seconds->Increment(wait_seconds);
      });
}

// What `tandem serve` prints once serving: where it listens, the mode and why, the pools.
std::string StartupLine(
    const config::TandemConfig& c, const ServeLayout& layout, const std::string& mode,
    const std::string& router, const std::string& http, const std::string& metrics_url,
    int prefill_workers,
    int store_shards, const std::map<std::string, std::unique_ptr<engine::ComputeShare>>& shares) {
  std::string compute;
  for (const auto& [device, share] : shares) {
    absl::StrAppend(&compute, compute.empty() ? "" : ", ", device, " ", share->pool().num_threads(),
                    " thread(s) shared");
  }
  return absl::StrCat(
      "tandem serve: model ", ModelId(c), " (", c.model.path, "); router on ", router, "; metrics ",
      metrics_url, "; ", http.empty() ? "" : absl::StrCat("http ", http, "; "), mode, " (", layout.why, "): ", prefill_workers, " prefill, ",
      c.serve.decode_workers, " decode worker(s), ", store_shards, " store shard(s); ", compute,
      "; prefill on ", (layout.colocated ? layout.decode_device : layout.prefill_device).ToString(),
      ", decode on ", layout.decode_device.ToString());
}

}  // namespace

absl::StatusOr<config::TandemConfig> EffectiveConfig(const CliArgs& args) {
  config::TandemConfig c;
  if (args.Has("config")) {
    TANDEM_ASSIGN_OR_RETURN(c, config::LoadConfigFile(*args.String("config")));
  }
  TANDEM_RETURN_IF_ERROR(config::ApplyOverrides(c, args.All("set")));
  if (args.Has("model")) c.model.path = *args.String("model");
  if (args.Has("metrics-listen")) c.metrics.listen = *args.String("metrics-listen");
  if (args.Has("http-listen")) c.router.http_listen = *args.String("http-listen");
  return c;
}

absl::Status RunServe(const CliArgs& args) {
  TANDEM_RETURN_IF_ERROR(args.CheckKnown(
      {"config", "set", "model", "listen", "metrics-listen", "http-listen"}));
  TANDEM_ASSIGN_OR_RETURN(config::TandemConfig c, EffectiveConfig(args));
  if (args.Has("listen")) c.router.listen = *args.String("listen");
  // security.tls (a router certificate) secures the public ports, gRPC and HTTP; the roles
  // inside talk over loopback.
  metrics::Metrics metrics("serve");
  TANDEM_ASSIGN_OR_RETURN(auto transport, RoleTransport(c, "router", &metrics));  // fails closed
  const sigset_t signals = BlockStopSignals();
  TANDEM_ASSIGN_OR_RETURN(auto metrics_server, StartMetrics(c, metrics));
  TANDEM_ASSIGN_OR_RETURN(auto loading, Loading::Start("serve", c.router.listen,
                                                       HealthNames("router"), *transport, signals));

  TANDEM_ASSIGN_OR_RETURN(const ServeLayout layout, ChooseServeLayout(c));
  // One compute pool per device, shared by every engine on it (a step per turn, decode first).
  // Declared before the roles, so it outlives them.
  std::map<std::string, std::unique_ptr<engine::ComputeShare>> shares;
  auto share_of = [&](const kernels::DeviceSpec& device) {
    auto& share = shares[device.ToString()];
    if (share == nullptr) share = MakeShare(device.ToString(), c.model.threads, metrics);
    return share.get();
  };
  const int prefill_workers = layout.colocated ? 0 : c.serve.prefill_workers;
  const bool prefill_shares = prefill_workers > 0 && layout.prefill_device == layout.decode_device;

  // Declared in start order; destroyed router first, store shards last.
  std::vector<std::unique_ptr<Role>> stores, prefills, decodes;
  std::unique_ptr<Role> router;
  config::TandemConfig inner = c;
  inner.router.mode = layout.colocated ? "colocated" : "disaggregated";
  inner.cache_store.listen = inner.prefill.listen = inner.decode.listen = kLoopback;
  inner.security.tls = {};  // the workers' and shards' (the router's is c's)
  inner.cache_store.shards.clear();
  const int store_shards = layout.colocated ? 0 : c.serve.cache_store_shards;
  for (int i = 0; i < store_shards; ++i) {
    config::TandemConfig shard_config = inner;
    if (!c.cache_store.disk.directory.empty()) {  // each shard its own, stable across restarts
      shard_config.cache_store.disk.directory =
          (std::filesystem::path(c.cache_store.disk.directory) / absl::StrCat("shard-", i))
              .string();
    }
    TANDEM_ASSIGN_OR_RETURN(auto role, StartCacheStore(shard_config, metrics));
    inner.cache_store.shards.push_back(role->address());
    stores.push_back(std::move(role));
  }
  inner.router.prefill_workers.clear();
  inner.router.decode_workers.clear();
  config::TandemConfig prefill_config = inner;
  prefill_config.model.device = layout.prefill_device.ToString();
  if (prefill_shares) {  // a decode step waits for at most one prefill step of this size
    auto& s = prefill_config.scheduler;
    s.max_num_batched_tokens = std::min(s.max_num_batched_tokens, c.serve.prefill_chunk_tokens);
    s.chunk_size = std::min(s.chunk_size, c.serve.prefill_chunk_tokens);
  }
  for (int i = 0; i < prefill_workers; ++i) {
    TANDEM_ASSIGN_OR_RETURN(auto role,
                            StartPrefill(prefill_config, share_of(layout.prefill_device), metrics));
    inner.router.prefill_workers.push_back(role->address());
    prefills.push_back(std::move(role));
  }
  config::TandemConfig decode_config = inner;
  decode_config.model.device = layout.decode_device.ToString();
  for (int i = 0; i < c.serve.decode_workers; ++i) {
    TANDEM_ASSIGN_OR_RETURN(auto role,
                            StartDecode(decode_config, share_of(layout.decode_device), metrics));
    inner.router.decode_workers.push_back(role->address());
    decodes.push_back(std::move(role));
  }
  config::TandemConfig router_config = inner;
  router_config.security.tls = c.security.tls;
  TANDEM_ASSIGN_OR_RETURN(router, StartRouter(router_config, metrics, /*workers_in_process=*/true));
  loading->Done();
  std::printf("%s\n", StartupLine(c, layout, inner.router.mode, router->address(),
                                  router->http_address(), MetricsUrl(c, metrics_server.get()),
                                  prefill_workers,
                                  store_shards, shares)
                          .c_str());
  std::fflush(stdout);

  const int sig = WaitForSignal(signals);
  std::fprintf(stderr, "tandem serve: signal %d, draining\n", sig);
  router->Drain();
  router.reset();
  decodes.clear();
  prefills.clear();
  stores.clear();
  return absl::OkStatus();
}

absl::Status RunRole(const std::string& role, const CliArgs& args) {
  TANDEM_RETURN_IF_ERROR(args.CheckKnown(
      {"config", "set", "model", "listen", "metrics-listen", "http-listen"}));
  TANDEM_ASSIGN_OR_RETURN(config::TandemConfig c, EffectiveConfig(args));
  std::string& listen = role == "router"    ? c.router.listen
                        : role == "prefill" ? c.prefill.listen
                        : role == "decode"  ? c.decode.listen
                                            : c.cache_store.listen;
  if (args.Has("listen")) listen = *args.String("listen");
  // Before anything binds: a listener beyond loopback without TLS fails here.
  metrics::Metrics metrics(role == "cache-store" ? "cache_store" : role);
  TANDEM_ASSIGN_OR_RETURN(auto transport, RoleTransport(c, role, &metrics));
  const sigset_t signals = BlockStopSignals();
  TANDEM_ASSIGN_OR_RETURN(auto metrics_server, StartMetrics(c, metrics));
  TANDEM_ASSIGN_OR_RETURN(auto loading,
                          Loading::Start(role, listen, HealthNames(role), *transport, signals));
  std::unique_ptr<Role> started;
  if (role == "router") {
    TANDEM_ASSIGN_OR_RETURN(started, StartRouter(c, metrics));
  } else if (role == "prefill") {
    TANDEM_ASSIGN_OR_RETURN(started, StartPrefill(c, nullptr, metrics));
  } else if (role == "decode") {
    TANDEM_ASSIGN_OR_RETURN(started, StartDecode(c, nullptr, metrics));
  } else {
    TANDEM_ASSIGN_OR_RETURN(started, StartCacheStore(c, metrics));
  }
  loading->Done();
  const std::string http = started->http_address();
  std::printf("tandem %s: serving on %s; metrics %s%s\n", role.c_str(), started->address().c_str(),
              MetricsUrl(c, metrics_server.get()).c_str(),
              http.empty() ? "" : absl::StrCat("; http ", http).c_str());
  std::fflush(stdout);
  const int sig = WaitForSignal(signals);
  std::fprintf(stderr, "tandem %s: signal %d, draining\n", role.c_str(), sig);
  started->Drain();
  return absl::OkStatus();
}

}  // namespace tandem::cli
