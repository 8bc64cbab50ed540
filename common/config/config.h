// One configuration for every role (router, prefill, decode, cache store, `tandem serve`), read
// from YAML. Every key has a type, bounds, a default and a line of documentation in one schema
// (config_schema.cc); docs/configuration.md is generated from it, so the two cannot drift.
// Unknown keys and wrong types are errors naming the key; command-line `--set key=value`
// overrides go through the same checks.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem::config {

struct ModelConfig {
  std::string path = "models/tandem-py-8l";  // Hugging Face model directory
  std::string name;                          // served name; empty: the directory's name
  std::string weight_memory = "hugepages";   // hugepages | mmap
  std::string weight_quantization = "none";  // none | int8 | int4
  int weight_quantization_group_size = 0;    // 0: the format's default; -1: one per row
  std::string activation_quantization = "none";  // none | int8 | int8-token
  std::string lm_head_quantization = "none";     // none | int8
  std::string cpu_gemm = "auto";                 // auto | tandem | onednn
  int threads = 0;                           // compute threads per engine; 0: all cores
  std::string device = "cpu";                // cpu | cuda | cuda:N
};

struct MixedKvConfig {
  int sink_tokens = 4;
  int window_tokens = 64;
  int64_t fp16_blocks = 0;  // 0: sized from the scheduler limits
};

struct KvEvictionConfig {
  std::string policy = "sliding";  // sliding | semantic
  int budget_tokens = 0;           // 0: off
  int sink_tokens = 4;
  double shift_threshold = 1.5;
  int chunk_tokens = 64;
};

struct KvCacheConfig {
  int block_size = 16;
  std::string dtype = "auto";  // auto (the model's dtype) | fp32 | fp16 | bf16 | int8 | mixed
  int64_t memory_bytes = int64_t{1} << 30;
  bool enable_prefix_caching = true;
  MixedKvConfig mixed;
  KvEvictionConfig eviction;
};

struct SchedulerConfig {
  int max_num_seqs = 64;
  int max_num_batched_tokens = 2048;
  int chunk_size = 512;
  // Tokens a decode worker gathers per streamed message (vLLM's and SGLang's stream_interval):
  // 1 streams each token as it is made; k sends every k-th (the first token and the last at
  // once), cutting the gRPC messages, and their CPU, k-fold for coarser delivery.
  int stream_interval = 1;
};

struct RouterConfig {
  std::string listen = "127.0.0.1:8000";
  std::string mode = "disaggregated";  // disaggregated | colocated
  int max_queued_requests = 1024;
  int64_t max_queued_tokens = 1 << 20;
  double default_deadline_seconds = 600;     // applied when the client sets none
  double grpc_write_timeout_seconds = 30;    // a Generate client that stops reading; 0: never
  std::vector<std::string> prefill_workers;  // static addresses; workers may also register
  std::vector<std::string> decode_workers;
  double heartbeat_interval_seconds = 1;
  double drain_seconds = 30;  // on SIGTERM: time for requests in flight to finish
  double worker_keepalive_seconds = 10;
  double forget_workers_after_seconds = 600;  // gone (removed or expired) this long: freed
  // The OpenAI-compatible HTTP front door.
  std::string http_listen;  // host:port; empty: off
  int http_threads = 2;
  int64_t http_max_body_bytes = 4 << 20;
  double http_read_timeout_seconds = 30;
  double http_write_timeout_seconds = 30;
  int max_n = 16;  // choices per prompt (n)
  // Limits on every request, whichever door (0: the model's context length).
  int64_t max_prompt_tokens = 0;
  int64_t max_tokens = 0;
  int max_stop_strings = 16;
  int max_stop_bytes = 256;
  int max_logprobs = 20;
  int64_t max_request_bytes = 4 << 20;  // a gRPC request message
  int http_max_header_bytes = 16 << 10;
  // Origins whose web pages may call the HTTP door from a browser (CORS), each
  // scheme://host[:port], or "*" for any; empty: none (browsers refuse cross-origin reads).
  std::vector<std::string> http_cors_origins;
};

struct BalancerConfig {
  double hit_rate_threshold = 0.90;
  double hysteresis = 0.03;
  double window_seconds = 30;
  int min_lookups = 50;
  int64_t max_prefill_ahead_bytes = int64_t{256} << 20;  // pacing cap while engaged
};

// The planner advisor in the router (docs/planner.md, "In the router"): with a profile, the
// router sizes its own deployment for the workload it measures and exports the replicas per
// role it recommends (tandem_planner_recommended_replicas{role}).
struct PlannerConfig {
  std::string profile;  // engine profile (engine-bench --profile-out); empty: off
  double slo_ttft_ms = 0;
  double slo_tpot_ms = 0;
  double attainment = 0.9;
  double window_seconds = 300;
  double interval_seconds = 60;
  int max_replicas = 64;
  double headroom = 1.25;
  int min_requests = 50;
  // The router, store shards and clients share the replicas' cores (one machine): plan with
  // the profile's shared-stack CPU (router::PlannerAdvisorOptions::shared_stack_cpu).
  bool shared_stack_cpu = false;
  // Correction factors fitted to the live deployment's measured TTFT and TPOT
  // (router::PlannerAdvisorOptions::correction).
  bool correction = true;
  double correction_smoothing = 0.5;
};

struct WorkerConfig {
  std::string listen = "127.0.0.1:0";
  std::string router = "";     // registry address; empty: static configuration only
  std::string advertise = "";  // address the router reaches this worker at; empty: listen's
};

// A shard's second tier: blocks on local disk behind its memory (cache_store/disk_tier.h).
struct CacheStoreDiskConfig {
  std::string directory;  // empty: no disk tier
  int64_t capacity_bytes = int64_t{16} << 30;
  int64_t segment_bytes = int64_t{256} << 20;
  int io_threads = 4;
};

struct CacheStoreConfig {
  std::string listen = "127.0.0.1:0";
  std::vector<std::string> shards;  // addresses of every shard, for consistent hashing
  int64_t capacity_bytes = int64_t{2} << 30;
  bool shared_memory = true;      // node-local fast path
  bool preallocate = false;       // allocate (and map in clients) the whole arena at startup
  std::string transport = "auto";  // auto | grpc | shm | ucx: how block bytes move
  bool reserve_ahead = true;      // prefill reserves shared-memory space while it computes
  bool load_prefixes = false;     // prefill imports a prompt's stored blocks, computes the rest
  int64_t chunk_bytes = 1 << 20;  // streaming chunk size
  int lease_seconds = 30;         // a shard's shared-memory and fabric leases
  CacheStoreDiskConfig disk;
};

struct MetricsConfig {
  std::string listen = "127.0.0.1:9090";  // empty: no /metrics endpoint
};

// The seed article's block, accepted verbatim (DESIGN.md, "Seed techniques").
struct KvCacheOptimizationConfig {
  bool enabled = false;
  int pruning_start_layer = 0;  // 0-based index of the first pruned layer
  double pruning_ratio = 0;     // > 0: prune this last fraction of the layers instead
  int pruning_keep_every = 0;   // the k-th, 2k-th, ... layers of the pruned range run; 0: none
  int protection_high_frequency_tokens = 0;
  int min_batch_size = 8;
  double monitor_sample_rate = 0;  // fraction of prefill requests the stability monitor checks
  double monitor_alert_below = 0.9;
};

struct ServeConfig {
  std::string mode = "auto";  // auto | disaggregated | colocated
  int prefill_chunk_tokens = 128;
  int prefill_workers = 1;
  int decode_workers = 1;
  int cache_store_shards = 1;
  std::string prefill_device;  // empty: model.device
  std::string decode_device;   // empty: model.device
};

// Mutual TLS between roles, and what a listener beyond loopback needs (DESIGN.md, "Security").
struct TlsConfig {
  std::string ca_file;    // PEM: the cluster CA
  std::string cert_file;  // PEM: this process's certificate (URI SAN names its role)
  std::string key_file;   // PEM: its private key
  int reload_seconds = 10;
};

struct SecurityConfig {
  TlsConfig tls;
  bool allow_insecure = false;  // listen beyond loopback without TLS (a trusted lab network)
  // With tls: still move KV blocks over the UCX fabric, which has no encryption (a dedicated
  // RDMA network).
  bool allow_unencrypted_kv_fabric = false;
  std::string role_uri_prefix = "spiffe://tandem/";
  // The public API's keys (common/security/api_keys.h); empty: no key needed.
  std::string api_keys_file;
  int64_t api_key_max_concurrent = 0;     // per key, unless its line says otherwise; 0: no limit
  int64_t api_key_tokens_per_minute = 0;  // per key, likewise
  bool cache_salt_per_key = false;
  bool health_needs_key = false;  // with api_keys_file: the HTTP GET /health asks for a key too
};

struct TandemConfig {
  ModelConfig model;
  KvCacheConfig kv_cache;
  SchedulerConfig scheduler;
  RouterConfig router;
  BalancerConfig balancer;
  PlannerConfig planner;
  WorkerConfig prefill;
  WorkerConfig decode;
  CacheStoreConfig cache_store;
  MetricsConfig metrics;
  KvCacheOptimizationConfig kv_cache_optimization;
  ServeConfig serve;
  SecurityConfig security;
};

// Parses YAML text; `source` names it in errors (a file name). Keys absent keep their defaults.
absl::StatusOr<TandemConfig> ParseConfig(std::string_view yaml, std::string_view source);
absl::StatusOr<TandemConfig> LoadConfigFile(const std::string& path);

// Applies one `key=value` override (dotted key, YAML scalar or flow-sequence value), with the
// same checks as the file.
absl::Status ApplyOverride(TandemConfig& config, std::string_view assignment);
// Applies every override in order, then the checks that span keys, so their order does not
// matter (`scheduler.max_num_batched_tokens=256` before `scheduler.chunk_size=256`). On an
// error `config` is unchanged.
absl::Status ApplyOverrides(TandemConfig& config, std::span<const std::string> assignments);

// Every key with its type, default and documentation, as a Markdown reference.
std::string ConfigReferenceMarkdown();

// The effective configuration as YAML, every key present (for logs and `tandem config`).
std::string ToYaml(const TandemConfig& config);

}  // namespace tandem::config
