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

class DecodeWorker final : public rpc::ServiceWorker<DecodeService> {
 public:
  // `loop`, `store` and `metrics` must outlive the worker.
  // `authorizer` (which roles may call the service) must outlive it too.
  // `stream_interval`: scheduler.stream_interval.
  DecodeWorker(engine::EngineLoop& loop, store::StorePool& store, metrics::Metrics& metrics,
               const security::Authorizer& authorizer = security::Authorizer::Open(),
               int stream_interval = 1);

  tandem::v1::WorkerRole role() const override { return tandem::v1::WORKER_ROLE_DECODE; }
};

}  // namespace tandem::decode
