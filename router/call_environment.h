// What one request's CallState uses of the router: the parts every call shares. RouterService
// owns them and outlives every call; CallState sees nothing else of the router.
//
// Each part is thread-safe and a leaf: it takes only its own mutex and never calls back into a
// call, so a call may use the pools, the balancer and the metrics while holding its own lock.
// The pacer and the request queue are used only outside it (their releases start other calls'
// prefills and end the request's accounting, which CallState runs as deferred work).
#pragma once

#include <atomic>
#include <cstdint>

#include "common/metrics/metrics.h"
#include "common/tokenizer/tokenizer.h"
#include "common/util/time_source.h"
#include "router/balancer.h"
#include "router/prefill_pacer.h"
#include "router/request_queue.h"
#include "router/router_options.h"
#include "router/worker_pool.h"
#include "router/workload_stats.h"

namespace tandem::router {

// The front door a request came in by; its metrics carry it as the `api` label.
enum class Door { kGrpc, kHttp };

struct CallEnvironment {
  const RouterOptions& options;
  const tokenizer::Tokenizer* tokenizer;  // null: token-id prompts only
  uint64_t model_hash;                    // of options.model_id, the first link of block hashes
  const metrics::RoleMetrics& metrics;    // the gRPC door's; handles may be null (no registry)
  const metrics::RoleMetrics& http_metrics;  // the HTTP door's (the gauges are shared)
  WorkerPool& prefill_pool;
  WorkerPool& decode_pool;
  Balancer& balancer;
  PrefillPacer& pacer;
  RequestQueue& queue;
  WorkloadStats& workload;             // arrivals and finishes, for the planner advisor
  const TimeSource& clock;             // the balancer's and the pacer's time
  std::atomic<uint64_t>& next_serial;  // request serials (pacer keys, default request ids)
  std::atomic<bool>& shutting_down;

  bool BalancerEngaged() const { return balancer.engaged(clock.Now()); }
  const metrics::RoleMetrics& MetricsOf(Door door) const {
    return door == Door::kHttp ? http_metrics : metrics;
  }
};

}  // namespace tandem::router
