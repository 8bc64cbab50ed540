#include "common/metrics/metrics.h"

#include <prometheus/text_serializer.h>

#include <exception>
#include <map>

#include "absl/strings/str_cat.h"

namespace tandem::metrics {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;
using prometheus::Histogram;

// 1 ms to ~130 s in factors of two: covers a token (ms) to a long request (minutes).
Histogram::BucketBoundaries LatencyBuckets() {
  Histogram::BucketBoundaries b;
  for (double s = 0.001; s < 200; s *= 2) b.push_back(s);
  return b;
}

// 100 us to ~3 s: per-token gaps and KV transfers.
Histogram::BucketBoundaries ShortBuckets() {
  Histogram::BucketBoundaries b;
  for (double s = 0.0001; s < 4; s *= 2) b.push_back(s);
  return b;
}

}  // namespace

Metrics::Metrics(std::string process_role)
    : registry_(std::make_shared<prometheus::Registry>()),
      process_(process_role.empty() ? nullptr
                                    : std::make_shared<ProcessCollector>(std::move(process_role))),
      ttft_(BuildHistogram()
                .Name("tandem_time_to_first_token_seconds")
                .Help("Time from request arrival to its first token")
                .Register(*registry_)),
      itl_(BuildHistogram()
               .Name("tandem_inter_token_latency_seconds")
               .Help("Time between consecutive streamed tokens of a request")
               .Register(*registry_)),
      e2e_(BuildHistogram()
               .Name("tandem_e2e_request_latency_seconds")
               .Help("Time from request arrival to its last token")
               .Register(*registry_)),
      queue_(BuildHistogram()
                 .Name("tandem_request_queue_time_seconds")
                 .Help("Time a request waited before its prefill started")
                 .Register(*registry_)),
      prefill_(BuildHistogram()
                   .Name("tandem_prefill_time_seconds")
                   .Help("Time spent computing a prompt's KV cache")
                   .Register(*registry_)),
      decode_(BuildHistogram()
                  .Name("tandem_decode_time_seconds")
                  .Help("Time from a request's first token to its last")
                  .Register(*registry_)),
      kv_transfer_(BuildHistogram()
                       .Name("tandem_kv_transfer_seconds")
                       .Help("Time to move a request's KV blocks between workers and the store")
                       .Register(*registry_)),
      kv_transfer_bytes_(BuildCounter()
                             .Name("tandem_kv_transfer_bytes_total")
                             .Help("KV bytes moved between workers and the cache store")
                             .Register(*registry_)),
      kv_usage_(BuildGauge()
                    .Name("tandem_kv_cache_usage_ratio")
                    .Help("Fraction of KV cache blocks in use (0-1)")
                    .Register(*registry_)),
      kv_requantized_(BuildCounter()
                          .Name("tandem_kv_cache_requantized_blocks_total")
                          .Help("Mixed-precision KV cache: fp16 blocks requantized to int8 as "
                                "they fell behind the window")
                          .Register(*registry_)),
      kv_lookups_(BuildCounter()
                      .Name("tandem_kv_lookups_total")
                      .Help("KV block lookups by result; hits by tier (worker: the worker's own "
                            "cache; memory, disk: the cache store's tiers)")
                      .Register(*registry_)),
      running_(BuildGauge()
                   .Name("tandem_requests_running")
                   .Help("Requests being prefilled or decoded")
                   .Register(*registry_)),
      waiting_(BuildGauge()
                   .Name("tandem_requests_waiting")
                   .Help("Requests queued for a worker")
                   .Register(*registry_)),
      prompt_tokens_(BuildCounter()
                         .Name("tandem_prompt_tokens_total")
                         .Help("Prompt tokens processed")
                         .Register(*registry_)),
      cached_prompt_tokens_(BuildCounter()
                                .Name("tandem_cached_prompt_tokens_total")
                                .Help("Prompt tokens prefill did not compute: found in the "
                                      "worker's prefix cache or imported from the cache store")
                                .Register(*registry_)),
      generation_tokens_(BuildCounter()
                             .Name("tandem_generation_tokens_total")
                             .Help("Tokens generated")
                             .Register(*registry_)),
      requests_(BuildCounter()
                    .Name("tandem_requests_total")
                    .Help("Finished requests by finish reason")
                    .Register(*registry_)),
      stalled_streams_(BuildCounter()
                           .Name("tandem_stalled_streams_total")
                           .Help("Response streams cut off because the client stopped reading")
                           .Register(*registry_)),
      pruned_layers_(BuildGauge()
                         .Name("tandem_pruned_layers")
                         .Help("Layers skipped by prefill-only pruning")
                         .Register(*registry_)),
      pruning_cosine_(BuildGauge()
                          .Name("tandem_pruning_attention_cosine")
                          .Help("Last sampled prompt's attention-output cosine similarity, "
                                "pruned against full prefill, per pruned layer")
                          .Register(*registry_)),
      device_memory_(BuildGauge()
                         .Name("tandem_device_memory_bytes")
                         .Help("Accelerator memory a worker on a device holds, by use "
                               "(weights, kv_cache)")
                         .Register(*registry_)),
      cpu_gemm_info_(BuildGauge()
                         .Name("tandem_cpu_gemm_info")
                         .Help("1, labelled with the GEMMs a worker on the CPU runs "
                               "(model.cpu_gemm as chosen: provider tandem or onednn) and the "
                               "ISA oneDNN reports for its CPU")
                         .Register(*registry_)),
      prefix_lookup_(BuildHistogram()
                         .Name("tandem_prefix_lookup_seconds")
                         .Help("Prefill workers with cache_store.load_prefixes: per prompt, the "
                               "time from its arrival to its computation queued, spent looking "
                               "its blocks up in the engine's cache and the store and "
                               "importing what was found")
                         .Register(*registry_)),
      kv_transport_seconds_(BuildHistogram()
                                .Name("tandem_kv_transport_seconds")
                                .Help("A worker's put or get of KV blocks with one cache-store "
                                      "shard, by the transport that carried it (grpc, shm, ucx)")
                                .Register(*registry_)),
      kv_transport_bytes_(BuildCounter()
                              .Name("tandem_kv_transport_bytes_total")
                              .Help("KV block bytes moved between workers and cache-store "
                                    "shards, by transport and direction")
                              .Register(*registry_)),
      kv_transport_transfers_(BuildCounter()
                                  .Name("tandem_kv_transport_transfers_total")
                                  .Help("Puts and gets of KV blocks with one cache-store shard, "
                                        "by transport, direction and result (ok, failed: the "
                                        "blocks count as not stored or missing)")
                                  .Register(*registry_)),
      auth_denied_(BuildCounter()
                       .Name("tandem_auth_denied_total")
                       .Help("Calls refused by authorization, by method and reason "
                             "(no_certificate, role, api_key)")
                       .Register(*registry_)),
      api_key_requests_(BuildCounter()
                            .Name("tandem_api_key_requests_total")
                            .Help("Public API requests by API key name and result (ok, or the "
                                  "limit that refused it: max_concurrent, tokens_per_minute)")
                            .Register(*registry_)),
      api_key_tokens_(BuildCounter()
                          .Name("tandem_api_key_tokens_total")
                          .Help("Prompt and generated tokens by API key name")
                          .Register(*registry_)),
      compute_turns_(BuildCounter()
                         .Name("tandem_compute_turns_total")
                         .Help("Engine steps on tandem serve's shared compute pool, by device "
                               "and phase")
                         .Register(*registry_)),
      compute_wait_(BuildCounter()
                        .Name("tandem_compute_turn_wait_seconds_total")
                        .Help("Time engine steps waited for another engine's step on the "
                              "shared compute pool, by device and phase")
                        .Register(*registry_)),
      stability_checks_(BuildCounter()
                            .Name("tandem_pruning_stability_checks_total")
                            .Help("Sampled prompts checked by the attention-stability monitor, "
                                  "by result (ok, alert: a pruned layer below the threshold)")
                            .Register(*registry_)),
      engine_steps_(BuildCounter()
                        .Name("tandem_engine_steps_total")
                        .Help("Engine steps (forward passes) a worker ran")
                        .Register(*registry_)),
      engine_step_sequences_(BuildCounter()
                                 .Name("tandem_engine_step_sequences_total")
                                 .Help("Engine steps' batch sizes summed (divided by the steps: "
                                       "the mean batch)")
                                 .Register(*registry_)),
      engine_loop_seconds_(BuildCounter()
                               .Name("tandem_engine_loop_seconds_total")
                               .Help("Wall time of a worker's engine loop by part: step (forward "
                                     "passes), tasks (admissions, KV imports and exports), "
                                     "outputs (streaming callbacks)")
                               .Register(*registry_)),
      engine_step_cpu_(BuildCounter()
                           .Name("tandem_engine_step_cpu_seconds_total")
                           .Help("CPU time of the engine loop's thread in steps (below the "
                                 "steps' wall time when it waited for a core)")
                           .Register(*registry_)),
      store_capacity_(BuildGauge()
                          .Name("tandem_cache_store_capacity_bytes")
                          .Help("Bytes a cache-store shard may hold")
                          .Register(*registry_)),
      store_used_(BuildGauge()
                      .Name("tandem_cache_store_used_bytes")
                      .Help("Bytes held by a cache-store shard: stored blocks and puts in flight")
                      .Register(*registry_)),
      store_blocks_(BuildGauge()
                        .Name("tandem_cache_store_blocks")
                        .Help("Blocks stored in a cache-store shard")
                        .Register(*registry_)),
      store_pinned_(BuildGauge()
                        .Name("tandem_cache_store_pinned_blocks")
                        .Help("Stored blocks pinned by a transfer in flight")
                        .Register(*registry_)),
      store_lookups_(BuildCounter()
                         .Name("tandem_cache_store_lookups_total")
                         .Help("Block reads from a cache-store shard by result")
                         .Register(*registry_)),
      store_puts_(
          BuildCounter()
              .Name("tandem_cache_store_puts_total")
              .Help("Block writes to a cache-store shard by outcome (stored; skipped: "
                    "already there; aborted: abandoned or failed its checksum; duplicate: written "
                    "alongside another writer that committed first, copy freed)")
              .Register(*registry_)),
      store_evictions_(BuildCounter()
                           .Name("tandem_cache_store_evictions_total")
                           .Help("Blocks a cache-store shard evicted (least recently used)")
                           .Register(*registry_)),
      store_corrupt_(BuildCounter()
                         .Name("tandem_cache_store_corrupt_blocks_total")
                         .Help("Blocks found changed after they were written, and dropped, by "
                               "tier")
                         .Register(*registry_)),
      store_tier_lookups_(
          BuildCounter()
              .Name("tandem_cache_store_tier_lookups_total")
              .Help("Block lookups by tier and result: memory first; a memory miss is looked "
                    "up on disk when the shard has a disk tier")
              .Register(*registry_)),
      store_disk_dropped_(BuildCounter()
                              .Name("tandem_cache_store_disk_dropped_total")
                              .Help("Disk-tier records dropped on read: stale (written with "
                                    "another layout than the reader's)")
                              .Register(*registry_)),
      store_disk_writes_(BuildCounter()
                             .Name("tandem_cache_store_disk_writes_total")
                             .Help("Blocks for the disk tier by outcome (written; failed: an I/O "
                                   "error or a full disk; evicted_first: left memory before the "
                                   "spill thread wrote it)")
                             .Register(*registry_)),
      store_disk_bytes_(BuildCounter()
                            .Name("tandem_cache_store_disk_bytes_total")
                            .Help("Block bytes read from and written to the disk tier")
                            .Register(*registry_)),
      store_disk_io_(BuildHistogram()
                         .Name("tandem_cache_store_disk_io_seconds")
                         .Help("Time to read or write one block on the disk tier")
                         .Register(*registry_)),
      store_fabric_messages_(
          BuildCounter()
              .Name("tandem_cache_store_fabric_messages_total")
              .Help("A shard's KV fabric (UCX) messages by direction (put: into the arena) and "
                    "outcome (moved; refused: a wrong key, lease, region or header, nothing "
                    "moved; failed: the peer went away mid-transfer; timed_out: cancelled at "
                    "the lease time, the peer stopped answering)")
              .Register(*registry_)),
      store_fabric_bytes_(BuildCounter()
                              .Name("tandem_cache_store_fabric_bytes_total")
                              .Help("KV block bytes a shard's fabric (UCX) moved, by direction")
                              .Register(*registry_)) {}

BalancerMetrics& Metrics::balancer(bool colocated) {
  std::call_once(balancer_once_, [&] {
    balancer_.decode_kv_hit_ratio =
        &BuildGauge()
             .Name("tandem_decode_kv_hit_ratio")
             .Help("Decode-side KV block hit rate over the balancer window (0-1)")
             .Register(*registry_)
             .Add({});
    balancer_.state = &BuildGauge()
                           .Name("tandem_balancer_state")
                           .Help("1 while the balancer is engaged (hit rate below threshold)")
                           .Register(*registry_)
                           .Add({});
    balancer_.reschedules = &BuildCounter()
                                 .Name("tandem_balancer_reschedules_total")
                                 .Help("Requests re-prefilled because their KV blocks missed")
                                 .Register(*registry_)
                                 .Add({});
    balancer_.recommended_prefill_to_decode_ratio =
        &BuildGauge()
             .Name("tandem_balancer_recommended_prefill_decode_ratio")
             .Help("Prefill:decode replica ratio the balancer recommends to autoscalers")
             .Register(*registry_)
             .Add({});
    auto& workers = BuildGauge()
                        .Name("tandem_workers")
                        .Help("Workers the router has in rotation, by pool")
                        .Register(*registry_);
    if (!colocated) balancer_.prefill_workers = &workers.Add({{"pool", "prefill"}});
    balancer_.decode_workers = &workers.Add({{"pool", "decode"}});
  });
  return balancer_;
}

PlannerMetrics& Metrics::planner(bool colocated) {
  std::call_once(planner_once_, [&] {
    auto gauge = [&](const char* name, const char* help) -> prometheus::Family<prometheus::Gauge>& {
      return BuildGauge().Name(name).Help(help).Register(*registry_);
    };
    auto& replicas = gauge("tandem_planner_recommended_replicas",
                           "Replicas per role the planner recommends for the measured workload");
    if (!colocated) planner_.recommended_prefill = &replicas.Add({{"role", "prefill"}});
    planner_.recommended_decode = &replicas.Add({{"role", "decode"}});
    planner_.feasible =
        &gauge("tandem_planner_feasible",
               "0 when even planner.max_replicas would miss the SLOs at the measured rate")
             .Add({});
    planner_.arrival_rate =
        &gauge("tandem_planner_arrival_rate", "Requests per second over the planner's window")
             .Add({});
    auto& tokens = gauge("tandem_planner_mean_tokens",
                         "Mean prompt and output tokens per request over the planner's window");
    planner_.mean_prompt_tokens = &tokens.Add({{"kind", "prompt"}});
    planner_.mean_output_tokens = &tokens.Add({{"kind", "output"}});
    auto& predicted = gauge("tandem_planner_predicted_seconds",
                            "The simulator's latency quantiles for the recommended deployment "
                            "at the measured rate");
    planner_.predicted_ttft_p90 = &predicted.Add({{"phase", "ttft"}, {"quantile", "0.9"}});
    planner_.predicted_tpot_p90 = &predicted.Add({{"phase", "tpot"}, {"quantile", "0.9"}});
    auto& correction = gauge("tandem_planner_correction_factor",
                             "How many times the profile's step time each phase takes on the "
                             "live deployment, as the planner fitted it (1: as profiled)");
    planner_.correction_prefill = &correction.Add({{"phase", "prefill"}});
    planner_.correction_decode = &correction.Add({{"phase", "decode"}});
  });
  return planner_;
}

StoreMetrics Metrics::ForShard(const std::string& address, ShardParts parts) {
  const prometheus::Labels l = {{"shard", address}};
  auto with = [&](const char* key, const char* value) {
    prometheus::Labels out = l;
    out.emplace(key, value);
    return out;
  };
  auto tier = [&](const char* name, const char* key = nullptr, const char* value = nullptr) {
    prometheus::Labels out = with("tier", name);
    if (key != nullptr) out.emplace(key, value);
    return out;
  };
  StoreMetrics m;
  m.capacity_bytes = &store_capacity_.Add(tier("memory"));
  m.used_bytes = &store_used_.Add(tier("memory"));
  m.blocks = &store_blocks_.Add(tier("memory"));
  m.pinned_blocks = &store_pinned_.Add(l);
  m.hits = &store_lookups_.Add(with("result", "hit"));
  m.misses = &store_lookups_.Add(with("result", "miss"));
  m.stored = &store_puts_.Add(with("outcome", "stored"));
  m.skipped = &store_puts_.Add(with("outcome", "skipped"));
  m.aborted = &store_puts_.Add(with("outcome", "aborted"));
  m.duplicate = &store_puts_.Add(with("outcome", "duplicate"));
  m.evictions = &store_evictions_.Add(tier("memory"));
  m.corrupt = &store_corrupt_.Add(tier("memory"));
  m.memory_hits = &store_tier_lookups_.Add(tier("memory", "result", "hit"));
  m.memory_misses = &store_tier_lookups_.Add(tier("memory", "result", "miss"));
  if (parts.fabric) {
    for (const char* direction : {"put", "get"}) {
      FabricShardMetrics::Direction& f = direction[0] == 'p' ? m.fabric.put : m.fabric.get;
      const prometheus::Labels d = with("direction", direction);
      auto outcome = [&](const char* value) -> prometheus::Counter* {
        prometheus::Labels out = d;
        out.emplace("outcome", value);
        return &store_fabric_messages_.Add(out);
      };
      f.moved = outcome("moved");
      f.refused = outcome("refused");
      f.failed = outcome("failed");
      f.timed_out = outcome("timed_out");
      f.bytes = &store_fabric_bytes_.Add(d);
    }
  }
  if (!parts.disk) return m;
  DiskTierMetrics& d = m.disk;
  d.capacity_bytes = &store_capacity_.Add(tier("disk"));
  d.used_bytes = &store_used_.Add(tier("disk"));
  d.blocks = &store_blocks_.Add(tier("disk"));
  d.hits = &store_tier_lookups_.Add(tier("disk", "result", "hit"));
  d.misses = &store_tier_lookups_.Add(tier("disk", "result", "miss"));
  d.evictions = &store_evictions_.Add(tier("disk"));
  d.corrupt = &store_corrupt_.Add(tier("disk"));
  d.stale = &store_disk_dropped_.Add(with("reason", "stale"));
  d.written = &store_disk_writes_.Add(with("outcome", "written"));
  d.write_failed = &store_disk_writes_.Add(with("outcome", "failed"));
  d.evicted_first = &store_disk_writes_.Add(with("outcome", "evicted_first"));
  d.read_bytes = &store_disk_bytes_.Add(with("op", "read"));
  d.write_bytes = &store_disk_bytes_.Add(with("op", "write"));
  d.read_seconds = &store_disk_io_.Add(with("op", "read"), ShortBuckets());
  d.write_seconds = &store_disk_io_.Add(with("op", "write"), ShortBuckets());
  return m;
}

RoleMetrics Metrics::ForRole(const std::string& role, const std::string& api) {
  const prometheus::Labels l = {{"role", role}};
  prometheus::Labels per_request = l;  // what each request adds to
  if (!api.empty()) per_request.emplace("api", api);
  auto with = [](prometheus::Labels labels, std::string_view key, std::string_view value) {
    labels.emplace(std::string(key), std::string(value));
    return labels;
  };
  RoleMetrics m;
  m.time_to_first_token = &ttft_.Add(per_request, LatencyBuckets());
  m.inter_token_latency = &itl_.Add(per_request, ShortBuckets());
  m.e2e_request_latency = &e2e_.Add(per_request, LatencyBuckets());
  m.request_queue_time = &queue_.Add(per_request, LatencyBuckets());
  m.prefill_time = &prefill_.Add(l, LatencyBuckets());
  m.decode_time = &decode_.Add(per_request, LatencyBuckets());
  m.kv_transfer_time = &kv_transfer_.Add(l, ShortBuckets());
  m.kv_transfer_bytes = &kv_transfer_bytes_.Add(l);
  m.kv_cache_usage = &kv_usage_.Add(l);
  m.kv_requantized_blocks = &kv_requantized_.Add(l);
  auto hit_in = [&](const char* tier) {
    return &kv_lookups_.Add(with(with(l, "result", "hit"), "tier", tier));
  };
  m.kv_lookup_hits = hit_in("worker");
  m.kv_lookup_memory_hits = hit_in("memory");
  m.kv_lookup_disk_hits = hit_in("disk");
  m.kv_lookup_misses = &kv_lookups_.Add(with(l, "result", "miss"));
  m.requests_running = &running_.Add(l);
  m.requests_waiting = &waiting_.Add(l);
  m.prompt_tokens = &prompt_tokens_.Add(per_request);
  m.cached_prompt_tokens = &cached_prompt_tokens_.Add(per_request);
  m.generation_tokens = &generation_tokens_.Add(per_request);
  m.finished_stop = &requests_.Add(with(per_request, "finish_reason", "stop"));
  m.finished_length = &requests_.Add(with(per_request, "finish_reason", "length"));
  m.finished_abort = &requests_.Add(with(per_request, "finish_reason", "abort"));
  m.finished_error = &requests_.Add(with(per_request, "finish_reason", "error"));
  m.stalled_streams = &stalled_streams_.Add(per_request);
  m.pruned_layers = &pruned_layers_.Add(l);
  m.stability_checks = &stability_checks_.Add(with(l, "result", "ok"));
  m.stability_alerts = &stability_checks_.Add(with(l, "result", "alert"));
  m.engine_steps = &engine_steps_.Add(l);
  m.engine_step_sequences = &engine_step_sequences_.Add(l);
  m.engine_step_seconds = &engine_loop_seconds_.Add(with(l, "part", "step"));
  m.engine_task_seconds = &engine_loop_seconds_.Add(with(l, "part", "tasks"));
  m.engine_output_seconds = &engine_loop_seconds_.Add(with(l, "part", "outputs"));
  m.engine_step_cpu_seconds = &engine_step_cpu_.Add(l);
  return m;
}

prometheus::Gauge* Metrics::PruningCosine(const std::string& role, int layer) {
  return &pruning_cosine_.Add({{"role", role}, {"layer", std::to_string(layer)}});
}

prometheus::Gauge* Metrics::DeviceMemory(const std::string& role, const std::string& use) {
  return &device_memory_.Add({{"role", role}, {"use", use}});
}

prometheus::Histogram* Metrics::PrefixLookupTime(const std::string& role) {
  return &prefix_lookup_.Add({{"role", role}}, ShortBuckets());
}

namespace {

constexpr std::string_view kTransportNames[KvTransportMetrics::kTransports] = {"grpc", "shm",
                                                                               "ucx"};

}  // namespace

KvTransportMetrics Metrics::KvTransports(const std::string& role) {
  KvTransportMetrics m;
  for (int t = 0; t < KvTransportMetrics::kTransports; ++t) {
    for (int put = 0; put < 2; ++put) {
      const std::map<std::string, std::string> labels = {
          {"role", role},
          {"transport", std::string(kTransportNames[t])},
          {"direction", put ? "put" : "get"}};
      auto with_result = [&](const char* result) {
        auto l = labels;
        l.emplace("result", result);
        return l;
      };
      m.handles_[t][put] = {.seconds = &kv_transport_seconds_.Add(labels, ShortBuckets()),
                            .bytes = &kv_transport_bytes_.Add(labels),
                            .ok = &kv_transport_transfers_.Add(with_result("ok")),
                            .failed = &kv_transport_transfers_.Add(with_result("failed"))};
    }
  }
  return m;
}

void KvTransportMetrics::Observe(std::string_view transport, bool put, bool ok, int64_t bytes,
                                 double seconds) const {
  for (int t = 0; t < kTransports; ++t) {
    if (kTransportNames[t] != transport) continue;
    const Handles& h = handles_[t][put ? 1 : 0];
    if (h.seconds == nullptr) return;  // never set up
    (ok ? h.ok : h.failed)->Increment();
    if (!ok) return;
    h.seconds->Observe(seconds);
    h.bytes->Increment(static_cast<double>(bytes));
    return;
  }
}

void Metrics::CpuGemmInfo(const std::string& role, const std::string& provider,
                          const std::string& isa) {
  cpu_gemm_info_.Add({{"role", role}, {"provider", provider}, {"isa", isa}}).Set(1);
}

prometheus::Counter* Metrics::AuthDenied(const std::string& method, const std::string& reason) {
  return &auth_denied_.Add({{"method", method}, {"reason", reason}});
}

prometheus::Counter* Metrics::ApiKeyRequests(const std::string& key, const std::string& result) {
  return &api_key_requests_.Add({{"key", key}, {"result", result}});
}

prometheus::Counter* Metrics::ApiKeyTokens(const std::string& key) {
  return &api_key_tokens_.Add({{"key", key}});
}

Metrics::ComputeTurn Metrics::ComputeTurns(const std::string& device, const std::string& phase) {
  const prometheus::Labels labels = {{"device", device}, {"phase", phase}};
  return {&compute_turns_.Add(labels), &compute_wait_.Add(labels)};
}

std::vector<std::shared_ptr<prometheus::Collectable>> Metrics::collectables() const {
  std::vector<std::shared_ptr<prometheus::Collectable>> out = {registry_};
  if (process_ != nullptr) out.push_back(process_);
  return out;
}

std::string Metrics::Serialize() const {
  std::vector<prometheus::MetricFamily> families;
  for (const auto& source : collectables()) {
    std::vector<prometheus::MetricFamily> more = source->Collect();
    families.insert(families.end(), more.begin(), more.end());
  }
  return prometheus::TextSerializer().Serialize(families);
}

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& listen,
                                                                    const Metrics& metrics) {
  return Start(listen, metrics.collectables());
}

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const std::string& listen, std::vector<std::shared_ptr<prometheus::Collectable>> sources) {
  std::unique_ptr<prometheus::Exposer> exposer;
  try {
    exposer = std::make_unique<prometheus::Exposer>(listen);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("metrics: cannot listen on ", listen, ": ", e.what()));
  }
  for (const auto& source : sources) exposer->RegisterCollectable(source);
  const std::vector<int> ports = exposer->GetListeningPorts();
  if (ports.empty()) return absl::UnavailableError("metrics: no listening port");
  return std::unique_ptr<MetricsServer>(new MetricsServer(std::move(exposer), ports.front()));
}

}  // namespace tandem::metrics
