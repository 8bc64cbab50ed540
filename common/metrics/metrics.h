// Tandem's Prometheus metrics (DESIGN.md, "Metrics"): every family is created once, here, and
// callers keep the returned handles, so the hot path never looks a metric up. One registry per
// process; `tandem serve` shares it between its roles, which is why gauges that each role owns
// carry a `role` label. No per-request labels.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/metrics/process_metrics.h"

namespace tandem::metrics {

// Request-path and KV metrics for one role ("router", "prefill", "decode", "cache_store").
struct RoleMetrics {
  prometheus::Histogram* time_to_first_token = nullptr;  // seconds
  prometheus::Histogram* inter_token_latency = nullptr;
  prometheus::Histogram* e2e_request_latency = nullptr;
  prometheus::Histogram* request_queue_time = nullptr;
  prometheus::Histogram* prefill_time = nullptr;
  prometheus::Histogram* decode_time = nullptr;  // router: first token to last, per request
  prometheus::Histogram* kv_transfer_time = nullptr;
  prometheus::Counter* kv_transfer_bytes = nullptr;
  prometheus::Gauge* kv_cache_usage = nullptr;  // 0-1
  // kv_cache.dtype mixed: fp16 blocks requantized to int8 as they fell behind the window.
  prometheus::Counter* kv_requantized_blocks = nullptr;
  // tandem_kv_lookups_total: hits by the tier the block was in (the worker's own cache, the
  // store's memory, the store's disk tier), and misses.
  prometheus::Counter* kv_lookup_hits = nullptr;  // tier="worker"
  prometheus::Counter* kv_lookup_memory_hits = nullptr;
  prometheus::Counter* kv_lookup_disk_hits = nullptr;
  prometheus::Counter* kv_lookup_misses = nullptr;
  prometheus::Gauge* requests_running = nullptr;
  prometheus::Gauge* requests_waiting = nullptr;
  prometheus::Counter* prompt_tokens = nullptr;
  prometheus::Counter* cached_prompt_tokens = nullptr;  // router: as its prefill worker reported
  prometheus::Counter* generation_tokens = nullptr;
  prometheus::Counter* finished_stop = nullptr;  // tandem_requests_total{finish_reason}
  prometheus::Counter* finished_length = nullptr;
  prometheus::Counter* finished_abort = nullptr;
  prometheus::Counter* finished_error = nullptr;
  // tandem_stalled_streams_total: response streams cut off because the client stopped reading
  // them (router.grpc_write_timeout_seconds, router.http_write_timeout_seconds).
  prometheus::Counter* stalled_streams = nullptr;
  prometheus::Gauge* pruned_layers = nullptr;
  // POP's attention-stability monitor (prefill workers),
  // tandem_pruning_stability_checks_total{result}: "ok", or "alert" when a pruned layer fell
  // below kv_cache_optimization.monitor.alert_below.
  prometheus::Counter* stability_checks = nullptr;
  prometheus::Counter* stability_alerts = nullptr;
  // The engine loop's time (engine::EngineLoop::LoopTime), workers only:
  // tandem_engine_steps_total, tandem_engine_step_sequences_total (/ steps = mean batch),
  // tandem_engine_loop_seconds_total{part="step"|"tasks"|"outputs"} (their rate summed is the
  // share of wall time the engine was busy) and tandem_engine_step_cpu_seconds_total.
  prometheus::Counter* engine_steps = nullptr;
  prometheus::Counter* engine_step_sequences = nullptr;
  prometheus::Counter* engine_step_seconds = nullptr;
  prometheus::Counter* engine_task_seconds = nullptr;
  prometheus::Counter* engine_output_seconds = nullptr;
  prometheus::Counter* engine_step_cpu_seconds = nullptr;
};

// Balancer state and the worker pools it balances, exported by the router.
struct BalancerMetrics {
  prometheus::Gauge* prefill_workers = nullptr;  // tandem_workers{pool}: in rotation; null if
                                                 // colocated
  prometheus::Gauge* decode_workers = nullptr;
  prometheus::Gauge* decode_kv_hit_ratio = nullptr;  // over the balancer's window
  prometheus::Gauge* state = nullptr;                // 0 normal, 1 engaged
  prometheus::Counter* reschedules = nullptr;
  prometheus::Gauge* recommended_prefill_to_decode_ratio = nullptr;
};

// The planner advisor's view: the workload the router measured and the replicas per role it
// recommends for it (router/planner_advisor.h). Every router exports them; 0 until a planner
// (planner.profile) publishes.
struct PlannerMetrics {
  // tandem_planner_recommended_replicas{role}: "prefill" (null if colocated) and "decode".
  prometheus::Gauge* recommended_prefill = nullptr;
  prometheus::Gauge* recommended_decode = nullptr;
  prometheus::Gauge* feasible = nullptr;      // 0 when even planner.max_replicas miss the SLOs
  prometheus::Gauge* arrival_rate = nullptr;  // requests/s over planner.window_seconds
  prometheus::Gauge* mean_prompt_tokens = nullptr;  // tandem_planner_mean_tokens{kind}
  prometheus::Gauge* mean_output_tokens = nullptr;
  // tandem_planner_predicted_seconds{phase, quantile="0.9"}: the simulator's TTFT and TPOT p90
  // for the recommended deployment at the measured rate (compare the measured histograms).
  prometheus::Gauge* predicted_ttft_p90 = nullptr;
  prometheus::Gauge* predicted_tpot_p90 = nullptr;
  // tandem_planner_correction_factor{phase}: the factors the planner plans with
  // (router::Corrections), prefill and decode.
  prometheus::Gauge* correction_prefill = nullptr;
  prometheus::Gauge* correction_decode = nullptr;
};

// One cache-store shard, labelled `shard` with its address (`tandem serve` may run several).
// Counters follow the shard's own (BlockStoreStats), so they are advanced by differences.
// A shard's disk tier (cache_store/disk_tier.h); every tier-labelled series is {tier="disk"}.
struct DiskTierMetrics {
  prometheus::Gauge* capacity_bytes = nullptr;
  prometheus::Gauge* used_bytes = nullptr;
  prometheus::Gauge* blocks = nullptr;
  prometheus::Counter* hits = nullptr;  // tandem_cache_store_tier_lookups_total{result}
  prometheus::Counter* misses = nullptr;
  prometheus::Counter* evictions = nullptr;
  prometheus::Counter* corrupt = nullptr;
  prometheus::Counter* stale = nullptr;          // tandem_cache_store_disk_dropped_total{reason}
  prometheus::Counter* written = nullptr;        // tandem_cache_store_disk_writes_total{outcome}
  prometheus::Counter* write_failed = nullptr;   // an I/O error or a full disk
  prometheus::Counter* evicted_first = nullptr;  // left memory before it could be written
  prometheus::Counter* read_bytes = nullptr;     // tandem_cache_store_disk_bytes_total{op}
  prometheus::Counter* write_bytes = nullptr;
  prometheus::Histogram* read_seconds = nullptr;  // tandem_cache_store_disk_io_seconds{op}, a block
  prometheus::Histogram* write_seconds = nullptr;
};

// A shard's KV fabric (cache_store/ucx_data_plane.h), for each direction (put: into the
// arena, get: out of it): tandem_cache_store_fabric_messages_total{direction, outcome} and
// tandem_cache_store_fabric_bytes_total{direction}.
struct FabricShardMetrics {
  struct Direction {
    prometheus::Counter* moved = nullptr;
    prometheus::Counter* refused = nullptr;  // a wrong key, lease, region or header
    prometheus::Counter* failed = nullptr;
    prometheus::Counter* timed_out = nullptr;  // cancelled at the lease time
    prometheus::Counter* bytes = nullptr;
  };
  Direction put, get;
};

struct StoreMetrics {
  prometheus::Gauge* capacity_bytes = nullptr;  // {tier="memory"}, as are used, blocks, hits...
  prometheus::Gauge* used_bytes = nullptr;  // committed blocks and pending puts
  prometheus::Gauge* blocks = nullptr;
  prometheus::Gauge* pinned_blocks = nullptr;
  prometheus::Counter* hits = nullptr;  // tandem_cache_store_lookups_total{result}
  prometheus::Counter* misses = nullptr;
  prometheus::Counter* stored = nullptr;  // tandem_cache_store_puts_total{outcome}
  prometheus::Counter* skipped = nullptr;
  prometheus::Counter* aborted = nullptr;
  prometheus::Counter* duplicate = nullptr;
  prometheus::Counter* evictions = nullptr;
  prometheus::Counter* corrupt = nullptr;
  prometheus::Counter* memory_hits = nullptr;  // tandem_cache_store_tier_lookups_total{result}
  prometheus::Counter* memory_misses = nullptr;
  DiskTierMetrics disk;       // with a disk tier only
  FabricShardMetrics fabric;  // with the fabric only
};

// A shard's parts beyond memory (Metrics::ForShard), whose series exist only where it has them.
struct ShardParts {
  bool disk = false;
  bool fabric = false;
};

// A worker's transfers with cache-store shards by the transport that carried each ("grpc",
// "shm", "ucx") and direction ("put", "get"): tandem_kv_transport_seconds (per call with one
// shard), tandem_kv_transport_bytes_total, tandem_kv_transport_transfers_total{result}. The
// handles exist from the start, so observing looks nothing up.
class KvTransportMetrics {
 public:
  static constexpr int kTransports = 3;  // grpc, shm, ucx
  void Observe(std::string_view transport, bool put, bool ok, int64_t bytes, double seconds) const;

 private:
  friend class Metrics;
  struct Handles {
    prometheus::Histogram* seconds = nullptr;
    prometheus::Counter* bytes = nullptr;
    prometheus::Counter* ok = nullptr;
    prometheus::Counter* failed = nullptr;
  };
  Handles handles_[kTransports][2] = {};  // [transport][put]
};

class Metrics {
 public:
  // `process_role` labels the process_* metrics (ProcessCollector); empty leaves them out.
  explicit Metrics(std::string process_role = "");
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // Handles for `role`; repeated calls for one role return the same metrics. With `api` (the
  // router: "grpc" or "http", the front door a request came in by) the metrics each request
  // adds to (latencies, tokens, tandem_requests_total) carry an `api` label as well; the role's
  // gauges and its prefill and KV-transfer metrics do not, so every door shares them.
  RoleMetrics ForRole(const std::string& role, const std::string& api = "");
  // The router's balancer and worker-pool metrics, registered by the first call, so processes
  // without a router export none of them. A colocated router has no prefill pool, hence no
  // tandem_workers{pool="prefill"} (its prefill_workers is null); the first call decides.
  BalancerMetrics& balancer(bool colocated = false);
  // The router's planner metrics, registered by the first call (as balancer()).
  PlannerMetrics& planner(bool colocated = false);
  StoreMetrics ForShard(const std::string& address, ShardParts parts = {});
  // tandem_pruning_attention_cosine{role, layer}: the last stability check's similarity in a
  // pruned layer.
  prometheus::Gauge* PruningCosine(const std::string& role, int layer);
  // tandem_device_memory_bytes{role, use}: accelerator memory a worker on a device holds, by
  // use ("weights", "kv_cache"). Workers that compute on the CPU never call it.
  prometheus::Gauge* DeviceMemory(const std::string& role, const std::string& use);
  // tandem_cpu_gemm_info{role, provider, isa} = 1: the GEMMs a worker on the CPU runs
  // (model.cpu_gemm as chosen, "tandem" or "onednn") and the ISA oneDNN reports for its CPU
  // ("avx2", "avx512_core_amx", ...), so a dashboard shows which workers run which and which
  // could run AMX. Workers on a device never call it.
  void CpuGemmInfo(const std::string& role, const std::string& provider, const std::string& isa);
  // tandem_prefix_lookup_seconds{role}: what cache_store.load_prefixes adds before a prompt is
  // computed (its lookups in the engine's cache and the store, and the import). Only prefill
  // workers that load prefixes call it.
  prometheus::Histogram* PrefixLookupTime(const std::string& role);
  // The transport metrics of `role` (KvTransportMetrics); workers call it once.
  KvTransportMetrics KvTransports(const std::string& role);
  // The turns of `tandem serve`'s shared compute pool on `device`, by phase ("prefill",
  // "decode"): tandem_compute_turns_total and tandem_compute_turn_wait_seconds_total (time a
  // step waited for another engine's step). Processes without a shared pool never call it.
  struct ComputeTurn {
    prometheus::Counter* turns;
    prometheus::Counter* wait_seconds;
  };
  ComputeTurn ComputeTurns(const std::string& device, const std::string& phase);
  // tandem_auth_denied_total{method, reason}: calls refused by the role check (reason
  // "no_certificate" or "role") or the API-key check; rare, so looked up per refusal.
  prometheus::Counter* AuthDenied(const std::string& method, const std::string& reason);
  // tandem_api_key_requests_total{key, result}: requests by API key name, admitted ("ok") or
  // refused by a limit ("max_concurrent", "tokens_per_minute"); tandem_api_key_tokens_total{key}:
  // prompt + generated tokens. Created once per key name.
  prometheus::Counter* ApiKeyRequests(const std::string& key, const std::string& result);
  prometheus::Counter* ApiKeyTokens(const std::string& key);
  const std::shared_ptr<prometheus::Registry>& registry() const { return registry_; }
  // Everything /metrics serves: the registry, and the process metrics if any.
  std::vector<std::shared_ptr<prometheus::Collectable>> collectables() const;

  // What /metrics serves, in Prometheus' text exposition format.
  std::string Serialize() const;

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<ProcessCollector> process_;
  prometheus::Family<prometheus::Histogram>& ttft_;
  prometheus::Family<prometheus::Histogram>& itl_;
  prometheus::Family<prometheus::Histogram>& e2e_;
  prometheus::Family<prometheus::Histogram>& queue_;
  prometheus::Family<prometheus::Histogram>& prefill_;
  prometheus::Family<prometheus::Histogram>& decode_;
  prometheus::Family<prometheus::Histogram>& kv_transfer_;
  prometheus::Family<prometheus::Counter>& kv_transfer_bytes_;
  prometheus::Family<prometheus::Gauge>& kv_usage_;
  prometheus::Family<prometheus::Counter>& kv_requantized_;
  prometheus::Family<prometheus::Counter>& kv_lookups_;
  prometheus::Family<prometheus::Gauge>& running_;
  prometheus::Family<prometheus::Gauge>& waiting_;
  prometheus::Family<prometheus::Counter>& prompt_tokens_;
  prometheus::Family<prometheus::Counter>& cached_prompt_tokens_;
  prometheus::Family<prometheus::Counter>& generation_tokens_;
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Counter>& stalled_streams_;
  prometheus::Family<prometheus::Gauge>& pruned_layers_;
  prometheus::Family<prometheus::Gauge>& pruning_cosine_;
  prometheus::Family<prometheus::Gauge>& device_memory_;
  prometheus::Family<prometheus::Gauge>& cpu_gemm_info_;
  prometheus::Family<prometheus::Histogram>& prefix_lookup_;
  prometheus::Family<prometheus::Histogram>& kv_transport_seconds_;
  prometheus::Family<prometheus::Counter>& kv_transport_bytes_;
  prometheus::Family<prometheus::Counter>& kv_transport_transfers_;
  prometheus::Family<prometheus::Counter>& auth_denied_;
  prometheus::Family<prometheus::Counter>& api_key_requests_;
  prometheus::Family<prometheus::Counter>& api_key_tokens_;
  prometheus::Family<prometheus::Counter>& compute_turns_;
  prometheus::Family<prometheus::Counter>& compute_wait_;
  prometheus::Family<prometheus::Counter>& stability_checks_;
  prometheus::Family<prometheus::Counter>& engine_steps_;
  prometheus::Family<prometheus::Counter>& engine_step_sequences_;
  prometheus::Family<prometheus::Counter>& engine_loop_seconds_;
  prometheus::Family<prometheus::Counter>& engine_step_cpu_;
  BalancerMetrics balancer_;
  std::once_flag balancer_once_;
  PlannerMetrics planner_;
  std::once_flag planner_once_;
  prometheus::Family<prometheus::Gauge>& store_capacity_;
  prometheus::Family<prometheus::Gauge>& store_used_;
  prometheus::Family<prometheus::Gauge>& store_blocks_;
  prometheus::Family<prometheus::Gauge>& store_pinned_;
  prometheus::Family<prometheus::Counter>& store_lookups_;
  prometheus::Family<prometheus::Counter>& store_puts_;
  prometheus::Family<prometheus::Counter>& store_evictions_;
  prometheus::Family<prometheus::Counter>& store_corrupt_;
  prometheus::Family<prometheus::Counter>& store_tier_lookups_;
  prometheus::Family<prometheus::Counter>& store_disk_dropped_;
  prometheus::Family<prometheus::Counter>& store_disk_writes_;
  prometheus::Family<prometheus::Counter>& store_disk_bytes_;
  prometheus::Family<prometheus::Histogram>& store_disk_io_;
  prometheus::Family<prometheus::Counter>& store_fabric_messages_;
  prometheus::Family<prometheus::Counter>& store_fabric_bytes_;
};

// Serves metrics on http://<listen>/metrics. "host:0" picks a free port.
class MetricsServer {
 public:
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& listen,
                                                              const Metrics& metrics);
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(
      const std::string& listen, std::vector<std::shared_ptr<prometheus::Collectable>> sources);
  int port() const { return port_; }

 private:
  MetricsServer(std::unique_ptr<prometheus::Exposer> exposer, int port)
      : exposer_(std::move(exposer)), port_(port) {}
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_;
};

}  // namespace tandem::metrics
