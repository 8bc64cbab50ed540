// A prefill worker as it runs in a deployment: its service over an engine loop and the cache
// store, the agent that publishes its metrics and registers it with the router, and POP's
// runtime monitor wired to its metrics (tandem_pruning_attention_cosine, alerts in the log).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/engine/engine_loop.h"
#include "common/metrics/metrics.h"
#include "common/rpc/worker_agent.h"
#include "common/store/store_pool.h"
#include "prefill_worker/prefill_service.h"

namespace tandem::prefill {

struct PrefillWorkerOptions {
  // Layers the engine's pruned prefill skips (1 = pruned), empty with POP off: exported as
  // tandem_pruned_layers, and the layers the stability monitor watches.
  std::vector<uint8_t> pruned_layers;
  double stability_sample_rate = 0;  // POP's monitor (kv_cache_optimization.monitor)
  double stability_alert_below = 0.9;
  // The engine's ExportPlan: reserve each prompt's store space while it computes
  // (PrefillServiceOptions::reserve_ahead).
  std::optional<engine::ExportPlan> reserve_ahead;
  // Import a prompt's stored blocks before computing it (PrefillServiceOptions::load_prefixes).
  bool load_prefixes = false;
  // Which roles may call the service; must outlive it.
  const security::Authorizer* authorizer = &security::Authorizer::Open();
};

class PrefillWorker final : public rpc::ServiceWorker<PrefillService> {
 public:
  // `loop`, `store` and `metrics` must outlive the worker.
  PrefillWorker(engine::EngineLoop& loop, store::StorePool& store, metrics::Metrics& metrics,
                const PrefillWorkerOptions& options);

  tandem::v1::WorkerRole role() const override { return tandem::v1::WORKER_ROLE_PREFILL; }
};

}  // namespace tandem::prefill
