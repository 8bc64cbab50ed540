// The router's worker registry (workers.proto, Registry): prefill and decode workers register
// with their address, model and KV layout, then heartbeat their load and resident prefix blocks.
// A worker of another model, or whose KV cache differs from the router's configured one (dtype,
// block size, geometry), is refused with FAILED_PRECONDITION, so prefill and decode can never
// disagree about the blocks they hand over. A worker silent for three heartbeat intervals leaves
// rotation until it registers again. Workers whose kernels differ (KvLayout.kernels: the own
// kernels, or oneDNN on one ISA or another) are accepted with a warning: they compute the same
// model, but a stream handed between them is not bit-equal to one engine's greedy.
//
// Threads: gRPC callbacks, plus one thread that expires silent workers.
#pragma once

#include <chrono>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/security/authorizer.h"
#include "router/router_service.h"
#include "tandem/v1/workers.grpc.pb.h"

namespace tandem::router {

class RegistryService final : public tandem::v1::Registry::CallbackService {
 public:
  // `router`, `metrics` (may be null) and `authorizer` must outlive the service.
  RegistryService(RouterService& router, std::chrono::duration<double> heartbeat_interval,
                  metrics::Metrics* metrics,
                  const security::Authorizer& authorizer = security::Authorizer::Open());
  ~RegistryService() override;

  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* context,
                                     const tandem::v1::RegisterRequest* request,
                                     tandem::v1::RegisterResponse* response) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context,
                                      const tandem::v1::HeartbeatRequest* request,
                                      tandem::v1::HeartbeatResponse* response) override;

 private:
  // Why a worker with KV layout `worker` cannot join ("" if it can).
  std::string KvMismatch(const tandem::v1::KvLayout& worker) const;
  // Records that `address` computes with `kernels` and returns a warning when another known
  // worker computes with other kernels ("" if none does).
  std::string KernelsWarning(const std::string& address, const std::string& kernels);
  void ExpireLoop();
  void PublishPoolSizes();

  RouterService& router_;
  metrics::Metrics* const metrics_;
  const std::chrono::duration<double> interval_;
  const security::Authorizer& authorizer_;
  absl::Notification stop_;
  absl::Mutex kernels_mu_;
  // Each known worker's KvLayout.kernels, by address; forgotten with the worker.
  absl::flat_hash_map<std::string, std::string> kernels_ ABSL_GUARDED_BY(kernels_mu_);
  std::thread expirer_;
};

}  // namespace tandem::router
