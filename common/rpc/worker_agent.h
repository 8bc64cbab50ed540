// What every worker role runs beside its gRPC service: a thread that publishes the engine's
// load and the service's counters to the role's metrics every 0.5 s, and, when the worker has a
// router, its registration with heartbeats (load, lookups and KV events). The prefill and
// decode workers (prefill_worker/, decode_worker/) each own one; what differs between them is
// what their service counts (WorkerCounters).
//
// Threads: its own metrics thread and the registration thread; both stop in the destructor,
// which must run before the engine loop and the counters are destroyed.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "absl/synchronization/notification.h"
#include "common/engine/engine_loop.h"
#include "common/metrics/metrics.h"
#include "common/rpc/registration.h"
#include "common/rpc/worker_load.h"
#include "common/security/transport.h"
#include "tandem/v1/workers.grpc.pb.h"

namespace tandem::rpc {

// The numbers a worker's service keeps (each thread-safe).
class WorkerCounters {
 public:
  virtual ~WorkerCounters() = default;
  virtual int64_t kv_bytes() const = 0;  // moved through the store
  // Block lookups at admission (decode); false: the service makes none.
  virtual bool counts_lookups() const { return false; }
  virtual int64_t kv_hits() const { return 0; }
  virtual int64_t kv_misses() const { return 0; }
  // kv_hits by where the block was: the worker's own cache, the cache store's memory, its disk
  // tier. Each is counted on its own, so each only grows.
  virtual int64_t kv_worker_hits() const { return 0; }
  virtual int64_t kv_store_memory_hits() const { return 0; }
  virtual int64_t kv_store_disk_hits() const { return 0; }
};

struct WorkerAgentOptions {
  std::string router;                        // empty: statically configured, no registration
  tandem::v1::RegisterRequest registration;  // role, advertised address, model id, KV layout
  // Told whether the router accepted the worker (its readiness); may be empty.
  std::function<void(bool accepted)> on_accepted;
  std::shared_ptr<const security::Transport> transport = security::Transport::Insecure();
};

class WorkerAgent {
 public:
  // `loop` and `counters` must outlive the agent.
  WorkerAgent(engine::EngineLoop& loop, const WorkerCounters& counters,
              const metrics::RoleMetrics& metrics, WorkerAgentOptions options);
  ~WorkerAgent();
  WorkerAgent(const WorkerAgent&) = delete;
  WorkerAgent& operator=(const WorkerAgent&) = delete;

 private:
  void PublishMetrics();
  // A heartbeat's load (registration thread).
  void FillLoad(tandem::v1::WorkerLoad* load, bool full);

  engine::EngineLoop& loop_;
  const WorkerCounters& counters_;
  const metrics::RoleMetrics metrics_;
  WorkerLoadReporter load_;  // registration thread only
  absl::Notification stop_;
  std::thread publisher_;
  std::unique_ptr<WorkerRegistration> registration_;
};

// A worker role as the process wiring it (tools/tandem) sees it: a service to serve and, once
// served, its agent. PrefillWorker and DecodeWorker are the two.
class Worker {
 public:
  virtual ~Worker() = default;
  virtual grpc::Service* service() = 0;
  virtual tandem::v1::WorkerRole role() const = 0;
  // Once the service is served: the registration names the address it is reached at.
  virtual void StartAgent(WorkerAgentOptions options) = 0;
  // Stops registration and metrics; call before the engine loop goes.
  virtual void StopAgent() = 0;
};

// What PrefillWorker and DecodeWorker share: the service (which keeps their WorkerCounters), the
// engine loop it runs on, the role's metrics, and the agent started once the service is served.
template <typename Service>
class ServiceWorker : public Worker {
 public:
  ~ServiceWorker() override { StopAgent(); }

  grpc::Service* service() override { return service_.get(); }
  void StartAgent(WorkerAgentOptions options) override {
    options.registration.set_role(role());
    agent_ = std::make_unique<WorkerAgent>(loop_, *service_, metrics_, std::move(options));
  }
  void StopAgent() override { agent_.reset(); }

 protected:
  ServiceWorker(engine::EngineLoop& loop, const metrics::RoleMetrics& metrics)
      : loop_(loop), metrics_(metrics) {}

  engine::EngineLoop& loop_;
  const metrics::RoleMetrics metrics_;
  std::unique_ptr<Service> service_;  // set by the derived constructor

 private:
  std::unique_ptr<WorkerAgent> agent_;
};

}  // namespace tandem::rpc
