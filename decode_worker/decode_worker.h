// A decode worker as it runs in a deployment: its service over an engine loop and the cache
// store, and the agent that publishes its metrics (lookups included) and registers it with the
// router.
#pragma once

#include <memory>

#include "common/engine/engine_loop.h"
#include "common/metrics/metrics.h"
#include "common/rpc/worker_agent.h"
#include "common/store/store_pool.h"
#include "decode_worker/decode_service.h"

namespace tandem::decode {

class DecodeWorker final : public rpc::Worker {
 public:
  // `loop`, `store` and `metrics` must outlive the worker.
  DecodeWorker(engine::EngineLoop& loop, store::StorePool& store, metrics::Metrics& metrics);
  ~DecodeWorker() override { StopAgent(); }

  grpc::Service* service() override { return service_.get(); }
  tandem::v1::WorkerRole role() const override { return tandem::v1::WORKER_ROLE_DECODE; }
  void StartAgent(rpc::WorkerAgentOptions options) override;
  void StopAgent() override { agent_.reset(); }

 private:
  engine::EngineLoop& loop_;
  const metrics::RoleMetrics metrics_;
  std::unique_ptr<DecodeService> service_;
  std::unique_ptr<rpc::WorkerAgent> agent_;
};

}  // namespace tandem::decode
