#include "router/registry_service.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "common/util/log.h"

namespace tandem::router {

namespace {
// KvLayout.kernels names a provider and an ISA ("onednn/avx512_core_amx"): well under this.
constexpr size_t kMaxKernelsBytes = 64;
}  // namespace

RegistryService::RegistryService(RouterService& router,
                                 std::chrono::duration<double> heartbeat_interval,
                                 metrics::Metrics* metrics, const security::Authorizer& authorizer)
    : router_(router), metrics_(metrics), interval_(heartbeat_interval), authorizer_(authorizer) {
  PublishPoolSizes();
  expirer_ = std::thread([this] { ExpireLoop(); });
}

RegistryService::~RegistryService() {
  stop_.Notify();
  expirer_.join();
}

grpc::ServerUnaryReactor* RegistryService::Register(grpc::CallbackServerContext* context,
                                                    const tandem::v1::RegisterRequest* request,
                                                    tandem::v1::RegisterResponse* response) {
  if (auto* denied = authorizer_.DenyUnary(context, "/tandem.v1.Registry/Register")) return denied;
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const std::string& model_id = router_.options().model_id;
  WorkerPool* pool = nullptr;
  if (request->role() == tandem::v1::WORKER_ROLE_PREFILL) pool = &router_.prefill_pool();
  if (request->role() == tandem::v1::WORKER_ROLE_DECODE) pool = &router_.decode_pool();
  if (pool == nullptr) {
    reactor->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                 "only prefill and decode workers register with the router"));
  } else if (request->address().empty() || request->address().find(':') == std::string::npos) {
    reactor->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                 "address must be host:port, got \"" + request->address() + "\""));
  } else if (request->layout().kernels().size() > kMaxKernelsBytes) {
    reactor->Finish(grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("layout.kernels is ", request->layout().kernels().size(), " bytes; at most ",
                     kMaxKernelsBytes, " (\"tandem\", \"onednn/<isa>\")")));
  } else if (request->model_id() != model_id) {
    reactor->Finish(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                 absl::StrCat("this router serves model \"", model_id,
                                              "\", the worker has \"", request->model_id(), "\"")));
  } else if (std::string mismatch = KvMismatch(request->layout()); !mismatch.empty()) {
    reactor->Finish(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, mismatch));
  } else {
    response->set_worker_id(pool->Register(request->address()));
    response->set_heartbeat_interval_seconds(interval_.count());
    Log(LogLevel::kInfo, "router",
        absl::StrCat(response->worker_id(), " registered at ", request->address()));
    response->set_warning(KernelsWarning(request->address(), request->layout().kernels()));
    if (!response->warning().empty()) Log(LogLevel::kWarning, "router", response->warning());
    PublishPoolSizes();
    reactor->Finish(grpc::Status::OK);
  }
  return reactor;
}

std::string RegistryService::KvMismatch(const tandem::v1::KvLayout& worker) const {
  const tandem::v1::KvLayout& want = router_.options().kv_layout;
  if (want.dtype().empty() || worker.dtype().empty()) return "";
  if (worker.weight_quantization() != want.weight_quantization()) {
    auto describe = [](const std::string& q) { return q.empty() ? "float weights" : q; };
    return absl::StrCat("weight mismatch: this router's workers compute with ",
                        describe(want.weight_quantization()), ", the worker with ",
                        describe(worker.weight_quantization()),
                        "; give every role the same model.weight_quantization (prefill and "
                        "decode must compute the same model)");
  }
  if (worker.weights_fingerprint() != 0 && want.weights_fingerprint() != 0 &&
      worker.weights_fingerprint() != want.weights_fingerprint()) {
    return absl::StrFormat(
        "weights mismatch: the worker's weight files (fingerprint %016x) are not this router's "
        "(%016x) under the same model id; serve one set of weights under one model.name",
        worker.weights_fingerprint(), want.weights_fingerprint());
  }
  if (worker.dtype() == want.dtype() && worker.block_size() == want.block_size() &&
      worker.num_layers() == want.num_layers() && worker.num_kv_heads() == want.num_kv_heads() &&
      worker.head_dim() == want.head_dim()) {
    return "";
  }
  auto describe = [](const tandem::v1::KvLayout& l) {
    return absl::StrCat(l.dtype(), " blocks of ", l.block_size(), " tokens (", l.num_layers(),
                        " layers x ", l.num_kv_heads(), " KV heads x ", l.head_dim(), ")");
  };
  return absl::StrCat("KV cache mismatch: this router's workers hold ", describe(want),
                      ", the worker holds ", describe(worker),
                      "; give every role the same kv_cache.dtype and kv_cache.block_size");
}

std::string RegistryService::KernelsWarning(const std::string& address,
                                            const std::string& kernels) {
  std::string other_address, other;
  {
    absl::MutexLock lock(&kernels_mu_);
    kernels_[address] = kernels;
    if (kernels.empty()) return "";
    for (const auto& [a, k] : kernels_) {
      if (!k.empty() && k != kernels) {
        other_address = a;
        other = k;
        break;
      }
    }
  }
  if (other.empty()) return "";
  return absl::StrCat(address, " computes with the kernels ", kernels, ", ", other_address,
                      " with ", other,
                      ": they compute the same model to other last bits, so a stream handed "
                      "between them can differ from one engine's greedy in a rare token; set "
                      "model.cpu_gemm to the same provider on every role to make them agree "
                      "(tandem gives the same bits on every CPU)");
}

grpc::ServerUnaryReactor* RegistryService::Heartbeat(grpc::CallbackServerContext* context,
                                                     const tandem::v1::HeartbeatRequest* request,
                                                     tandem::v1::HeartbeatResponse* response) {
  if (auto* denied = authorizer_.DenyUnary(context, "/tandem.v1.Registry/Heartbeat")) {
    return denied;
  }
  HeartbeatResult r = router_.prefill_pool().Heartbeat(request->worker_id(), request->load());
  if (!r.known) r = router_.decode_pool().Heartbeat(request->worker_id(), request->load());
  response->set_known(r.known);
  response->set_resync(r.resync);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

void RegistryService::ExpireLoop() {
  const auto silence = std::chrono::duration_cast<Clock::duration>(3 * interval_);
  while (!stop_.WaitForNotificationWithTimeout(absl::Seconds(interval_.count()))) {
    for (WorkerPool* pool : {&router_.prefill_pool(), &router_.decode_pool()}) {
      for (const std::string& address : pool->ExpireSilent(silence)) {
        Log(LogLevel::kWarning, "router",
            absl::StrCat(address, " missed three heartbeats: out of rotation"));
      }
      for (const std::string& address : pool->ForgetGone()) {
        Log(LogLevel::kInfo, "router", absl::StrCat(address, " has been gone long: forgotten"));
        absl::MutexLock lock(&kernels_mu_);
        kernels_.erase(address);
      }
    }
    PublishPoolSizes();
    router_.PollPacing();
  }
}

// Also refreshes the balancer's recommended prefill:decode ratio, which follows the pools and
// the hit rate (an autoscaler reads it; see deploy/k8s).
void RegistryService::PublishPoolSizes() {
  const int prefill = router_.prefill_pool().available();
  const int decode = router_.decode_pool().available();
  router_.balancer().PublishRecommendedRatio(prefill, decode, router_.clock().Now());
  if (metrics_ == nullptr) return;
  metrics::BalancerMetrics& m = metrics_->balancer(router_.options().colocated);
  if (m.prefill_workers != nullptr) m.prefill_workers->Set(prefill);
  m.decode_workers->Set(decode);
}

}  // namespace tandem::router
