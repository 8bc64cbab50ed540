#include "tools/tandem/roles.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "cache_store/block_store.h"
#include "cache_store/cache_store_service.h"
#include "common/chat/chat_template.h"
#include "common/engine/engine_loop.h"
#include "common/engine/kv_handoff.h"
#include "common/kernels/backend_factory.h"
#include "common/kernels/cpu/onednn_gemm.h"
#include "common/model/model.h"
#include "common/model/pruning.h"
#include "common/rpc/engine_proto.h"
#include "common/rpc/registration.h"
#include "common/rpc/server.h"
#include "common/rpc/worker_agent.h"
#include "common/security/api_keys.h"
#include "common/security/authorizer.h"
#include "common/store/store_pool.h"
#include "common/tokenizer/tokenizer.h"
#include "common/util/file_util.h"
#include "common/util/log.h"
#include "common/util/status_macros.h"
#include "common/util/thread_pool.h"
#include "decode_worker/decode_worker.h"
#include "prefill_worker/prefill_worker.h"
#include "router/http/http_server.h"
#include "router/http/openai_door.h"
#include "router/planner_advisor.h"
#include "router/registry_service.h"
#include "router/router_service.h"

namespace tandem::cli {
namespace {

constexpr char kInference[] = "tandem.v1.Inference";
constexpr char kPrefill[] = "tandem.v1.PrefillWorker";
constexpr char kDecode[] = "tandem.v1.DecodeWorker";
constexpr char kCacheStore[] = "tandem.v1.CacheStore";
constexpr char kRegistry[] = "tandem.v1.Registry";

// The KV cache's dtype; a mixed cache's wide blocks are fp16.
absl::StatusOr<DType> KvDType(const config::TandemConfig& c, const model::ModelConfig& m) {
  if (c.kv_cache.dtype == "auto") return m.torch_dtype;
  if (c.kv_cache.dtype == "mixed") return DType::kF16;
  return ParseKvDType(c.kv_cache.dtype);
}

// The KV cache a worker of config `c` holds, as it registers with the router and as the router
// expects it: dtype "mixed" for a mixed-precision cache, else the block dtype.
// `weights_fingerprint`: ModelWeights::fingerprint of the model served.
absl::StatusOr<tandem::v1::KvLayout> KvLayoutMessage(const config::TandemConfig& c,
                                                     const model::ModelConfig& m,
                                                     uint64_t weights_fingerprint) {
  TANDEM_ASSIGN_OR_RETURN(DType dtype, KvDType(c, m));
  TANDEM_ASSIGN_OR_RETURN(kernels::QuantFormat quant,
                          model::ParseWeightQuantization(c.model.weight_quantization,
                                                         c.model.weight_quantization_group_size,
                                                         c.model.activation_quantization));
  TANDEM_ASSIGN_OR_RETURN(kernels::QuantFormat head,
                          model::ParseLmHeadQuantization(c.model.lm_head_quantization, quant));
  tandem::v1::KvLayout layout =
      rpc::ToProto(m.KvLayoutFor(dtype, c.kv_cache.block_size), c.kv_cache.dtype == "mixed");
  // A quantized checkpoint names its own format (model.weight_quantization is then refused).
  layout.set_weight_quantization(model::LoadedQuantizationName(m.quantization, quant, head));
  layout.set_weights_fingerprint(weights_fingerprint);
  return layout;
}

// `prefill`: the engine of a prefill worker, the one role that prunes (POP); decode always runs
// the full model.
absl::StatusOr<engine::EngineOptions> EngineOptionsFor(const config::TandemConfig& c,
                                                       const model::ModelConfig& m, bool prefill) {
  engine::EngineOptions o;
  o.block_size = c.kv_cache.block_size;
  TANDEM_ASSIGN_OR_RETURN(o.kv_dtype, KvDType(c, m));
  o.kv_cache_bytes = c.kv_cache.memory_bytes;
  o.max_num_seqs = c.scheduler.max_num_seqs;
  o.max_num_batched_tokens = c.scheduler.max_num_batched_tokens;
  o.chunk_size = c.scheduler.chunk_size;
  o.enable_prefix_caching = c.kv_cache.enable_prefix_caching;
  o.mixed_kv = {.enabled = c.kv_cache.dtype == "mixed",
                .sink_tokens = c.kv_cache.mixed.sink_tokens,
                .window_tokens = c.kv_cache.mixed.window_tokens,
                .wide_blocks = c.kv_cache.mixed.fp16_blocks};
  o.kv_eviction = {.budget_tokens = c.kv_cache.eviction.budget_tokens,
                   .sink_tokens = c.kv_cache.eviction.sink_tokens,
                   .semantic = c.kv_cache.eviction.policy == "semantic",
                   .shift_threshold = c.kv_cache.eviction.shift_threshold,
                   .chunk_tokens = c.kv_cache.eviction.chunk_tokens};
  o.model_id = ModelId(c);
  const auto& pop = c.kv_cache_optimization;
  o.pruning.enabled = prefill && pop.enabled;
  if (o.pruning.enabled) {
    auto settings = model::ResolvePruningSettings(
        pop.pruning_start_layer, pop.pruning_ratio, pop.pruning_keep_every,
        pop.protection_high_frequency_tokens, m.num_layers);
    if (!settings.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("kv_cache_optimization: ", settings.status().message()));
    }
    o.pruning.settings = *settings;
  }
  o.pruning.min_batch_size = pop.min_batch_size;
  return o;
}

// Whether KV bytes may cross the UCX fabric, which has no encryption: not under TLS, unless the
// operator says the fabric is a dedicated one.
bool KvFabricAllowed(const config::TandemConfig& c) {
  return c.security.tls.ca_file.empty() || c.security.allow_unencrypted_kv_fabric;
}

// cache_store.transport as a worker applies it; says at startup what it took.
store::StorePoolOptions StoreTransport(const config::TandemConfig& c, const std::string& role) {
  const std::string& t = c.cache_store.transport;
  store::StorePoolOptions o;
  o.shared_memory = c.cache_store.shared_memory && (t == "auto" || t == "shm");
  o.fabric = t == "ucx"                          ? store::FabricUse::kEveryShard
             : t == "auto" && KvFabricAllowed(c) ? store::FabricUse::kRemoteShards
                                                 : store::FabricUse::kNever;
  std::string how = t == "grpc"  ? "the gRPC stream with every shard"
                    : t == "ucx" ? "UCX with every shard that serves it"
                                 : "shared memory with shards on this machine";
  if (t == "auto") {
    how += o.fabric == store::FabricUse::kRemoteShards
               ? ", UCX with the others that serve it"
               : " (no UCX: security.tls without security.allow_unencrypted_kv_fabric)";
  }
  if (t != "grpc") how += ", the gRPC stream where neither";
  if (o.fabric != store::FabricUse::kNever) {
    const char* tls = std::getenv("UCX_TLS");
    how += absl::StrCat(" (UCX_TLS=", tls != nullptr ? tls : "all", ")");
  }
  Log(LogLevel::kInfo, role, absl::StrCat("KV blocks move by ", how));
  return o;
}

// Drains on Drain(); the server goes first on destruction.
class ServedRole : public Role {
 public:
  const std::string& address() const override { return server_.address; }
  void Drain() override {
    absl::MutexLock lock(&health_mu_);
    draining_ = true;
    rpc::SetServing(*server_.server, names_, false);
  }

 protected:
  // Readiness: the health of the role's service names, not the process's own (""), so a
  // Kubernetes readiness probe on the service fails while its liveness probe passes. No effect
  // once draining.
  void SetReady(bool ready) {
    absl::MutexLock lock(&health_mu_);
    if (!draining_) rpc::SetServicesServing(*server_.server, names_, ready);
  }
  void Serve(rpc::StartedServer server, std::vector<std::string> names) {
    server_ = std::move(server);
    names_ = std::move(names);
    rpc::SetServing(*server_.server, names_, true);
  }
  // Calls still running after `grace` are cancelled; the server is gone before the services
  // it serves (the derived members) are destroyed.
  void StopServer(std::chrono::milliseconds grace = std::chrono::milliseconds(0)) {
    if (server_.server == nullptr) return;
    server_.server->Shutdown(std::chrono::system_clock::now() + grace);
    server_.server->Wait();
    server_.server.reset();
  }

  // The transport for `role` and the authorizer its services check calls with.
  absl::Status Secure(const config::TandemConfig& c, const std::string& role,
                      metrics::Metrics& metrics) {
    TANDEM_ASSIGN_OR_RETURN(transport_, RoleTransport(c, role, &metrics));
    authorizer_ = std::make_unique<security::Authorizer>(transport_, &metrics);
    return absl::OkStatus();
  }

  rpc::StartedServer server_;
  std::vector<std::string> names_;
  // Outlive the derived roles' services, which hold references to them.
  std::shared_ptr<const security::Transport> transport_;
  std::unique_ptr<security::Authorizer> authorizer_;

 private:
  absl::Mutex health_mu_;
  bool draining_ ABSL_GUARDED_BY(health_mu_) = false;
};

// A shard's `shard` metric label: its address, with a wildcard host (0.0.0.0, [::]) replaced by
// the host name, so shards of a StatefulSet, all listening on 0.0.0.0:7000, stay apart
// (tandem-cache-store-0:7000, tandem-cache-store-1:7000, ...).
std::string ShardLabel(const std::string& address) {
  const size_t colon = address.rfind(':');
  const std::string host = address.substr(0, colon);
  if (host != "0.0.0.0" && host != "[::]" && host != "::") return address;
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return address;
  return absl::StrCat(name, address.substr(colon));
}

class CacheStoreRole final : public ServedRole {
 public:
  ~CacheStoreRole() override {
    StopServer();
    stop_.Notify();
    if (reporter_.joinable()) reporter_.join();
  }

  absl::Status Start(const config::TandemConfig& c, metrics::Metrics& metrics) {
    TANDEM_RETURN_IF_ERROR(Secure(c, "cache-store", metrics));
    cache_store::BlockStoreOptions o;
    o.capacity_bytes = c.cache_store.capacity_bytes;
    // The KV fabric moves bytes in and out of the arena: a shard that may serve it keeps its
    // blocks there even where it hands none out through shared memory.
    o.shared_memory = c.cache_store.shared_memory || FabricWanted(c);
    o.preallocate = c.cache_store.preallocate;
    const config::CacheStoreDiskConfig& disk = c.cache_store.disk;
    if (!disk.directory.empty()) {
      o.disk.directory = disk.directory;
      o.disk.capacity_bytes = disk.capacity_bytes;
      o.disk.segment_bytes = disk.segment_bytes;
      o.disk.io_threads = disk.io_threads;
      // The histograms exist once the server's address is known: until then, nothing to note.
      o.disk.on_read = [this](double seconds, int64_t) { Observe(read_seconds_, seconds); };
      o.disk.on_write = [this](double seconds, int64_t) { Observe(write_seconds_, seconds); };
    }
    TANDEM_ASSIGN_OR_RETURN(store_, cache_store::BlockStore::Create(o));
    if (!disk.directory.empty()) {
      const cache_store::DiskTierStats d = store_->Stats().disk;
      Log(LogLevel::kInfo, "cache-store",
          absl::StrCat("disk tier ", disk.directory, ": ", d.capacity_bytes >> 20, " MiB, ",
                       d.recovered_blocks, " blocks recovered"));
    }
    service_ = std::make_unique<cache_store::CacheStoreService>(
        *store_, c.cache_store.chunk_bytes,
        cache_store::ShmHandoffOptions{
            .leases = {.ttl = std::chrono::seconds(c.cache_store.lease_seconds)},
            .offer_shared_memory = c.cache_store.shared_memory},
        *authorizer_);
    TANDEM_RETURN_IF_ERROR(StartFabric(c));
    TANDEM_ASSIGN_OR_RETURN(auto server,
                            rpc::StartServer(c.cache_store.listen, {service_.get()}, {kCacheStore},
                                             {.transport = transport_.get()}));
    Serve(std::move(server), {kCacheStore});
    metrics_ = metrics.ForShard(ShardLabel(address()), {.disk = !disk.directory.empty(),
                                                        .fabric = service_->fabric() != nullptr});
    read_seconds_ = metrics_.disk.read_seconds;
    write_seconds_ = metrics_.disk.write_seconds;
    reporter_ = std::thread([this] { Report(); });
    return absl::OkStatus();
  }

 private:
  static void Observe(const std::atomic<prometheus::Histogram*>& h, double seconds) {
    if (prometheus::Histogram* histogram = h.load()) histogram->Observe(seconds);
  }

  // Whether cache_store.transport lets the shard serve the UCX data plane.
  static bool FabricWanted(const config::TandemConfig& c) {
    const std::string& t = c.cache_store.transport;
    return (t == "auto" || t == "ucx") && KvFabricAllowed(c);
  }

  // The UCX data plane, where cache_store.transport allows it: required with ucx, best effort
  // with auto (a shard without an arena or a UCX transport streams).
  absl::Status StartFabric(const config::TandemConfig& c) {
    const std::string& t = c.cache_store.transport;
    if (t == "grpc" || t == "shm") return absl::OkStatus();
    if (!FabricWanted(c)) {  // auto with TLS: ucx was refused at validation
      Log(LogLevel::kInfo, "cache-store",
          "KV fabric off: security.tls is set and security.allow_unencrypted_kv_fabric is not");
      return absl::OkStatus();
    }
    absl::Status s = service_->EnableFabric();
    if (s.ok()) {
      Log(LogLevel::kInfo, "cache-store",
          absl::StrCat(
              "KV fabric: UCX serves the arena (UCX_TLS=", service_->fabric()->transports(), ")"));
      return absl::OkStatus();
    }
    if (t == "ucx") return s;
    Log(LogLevel::kInfo, "cache-store", absl::StrCat("KV fabric off: ", s.message()));
    return absl::OkStatus();
  }

  // Publishes the shard's stats every 0.5 s.
  void Report() {
    cache_store::BlockStoreStats last;
    cache_store::UcxDataPlaneStats last_fabric;
    auto advance = [](prometheus::Counter* c, int64_t now, int64_t before) {
      c->Increment(static_cast<double>(now - before));
    };
    do {
      if (const cache_store::UcxDataPlane* fabric = service_->fabric()) {
        const cache_store::UcxDataPlaneStats f = fabric->Stats();
        for (bool put : {true, false}) {
          const metrics::FabricShardMetrics::Direction& m =
              put ? metrics_.fabric.put : metrics_.fabric.get;
          const cache_store::UcxDataPlaneStats::Direction &d = put ? f.put : f.get,
                                                          &was = put ? last_fabric.put
                                                                     : last_fabric.get;
          advance(m.moved, d.messages, was.messages);
          advance(m.refused, d.refused, was.refused);
          advance(m.failed, d.failed, was.failed);
          advance(m.timed_out, d.timed_out, was.timed_out);
          advance(m.bytes, d.bytes, was.bytes);
        }
        last_fabric = f;
      }
      const cache_store::BlockStoreStats s = store_->Stats();
      metrics_.capacity_bytes->Set(static_cast<double>(s.capacity_bytes));
      metrics_.used_bytes->Set(static_cast<double>(s.used_bytes));
      metrics_.blocks->Set(static_cast<double>(s.blocks));
      metrics_.pinned_blocks->Set(static_cast<double>(s.pinned_blocks));
      advance(metrics_.hits, s.hits, last.hits);
      advance(metrics_.misses, s.misses, last.misses);
      advance(metrics_.memory_hits, s.memory_hits, last.memory_hits);
      advance(metrics_.memory_misses, s.memory_misses, last.memory_misses);
      advance(metrics_.stored, s.puts, last.puts);
      advance(metrics_.skipped, s.put_skipped, last.put_skipped);
      advance(metrics_.aborted, s.put_aborted, last.put_aborted);
      advance(metrics_.duplicate, s.duplicate_puts, last.duplicate_puts);
      advance(metrics_.evictions, s.evictions, last.evictions);
      advance(metrics_.corrupt, s.corrupt, last.corrupt);
      if (s.has_disk) {
        const metrics::DiskTierMetrics& m = metrics_.disk;
        const cache_store::DiskTierStats &d = s.disk, &was = last.disk;
        m.capacity_bytes->Set(static_cast<double>(d.capacity_bytes));
        m.used_bytes->Set(static_cast<double>(d.used_bytes));
        m.blocks->Set(static_cast<double>(d.blocks));
        // Served from disk: the Gets that missed memory and did not miss both tiers.
        advance(m.hits, s.memory_misses - s.disk_misses, last.memory_misses - last.disk_misses);
        advance(m.misses, s.disk_misses, last.disk_misses);
        advance(m.evictions, d.evictions, was.evictions);
        advance(m.corrupt, d.corrupt, was.corrupt);
        advance(m.stale, d.stale, was.stale);
        advance(m.written, d.writes, was.writes);
        advance(m.write_failed, d.write_failures + d.write_no_room,
                was.write_failures + was.write_no_room);
        advance(m.evicted_first, s.evicted_unspilled, last.evicted_unspilled);
        advance(m.read_bytes, d.read_bytes, was.read_bytes);
        advance(m.write_bytes, d.write_bytes, was.write_bytes);
      }
      last = s;
    } while (!stop_.WaitForNotificationWithTimeout(absl::Milliseconds(500)));
  }

  std::atomic<prometheus::Histogram*> read_seconds_{nullptr}, write_seconds_{nullptr};
  std::unique_ptr<cache_store::BlockStore> store_;
  std::unique_ptr<cache_store::CacheStoreService> service_;
  metrics::StoreMetrics metrics_;
  absl::Notification stop_;
  std::thread reporter_;
};

// A prefill or decode worker: its model, engine loop and store client, and the worker itself
// (prefill_worker/, decode_worker/: service, metrics, registration).
class WorkerRole final : public ServedRole {
 public:
  ~WorkerRole() override {
    if (worker_ != nullptr) worker_->StopAgent();
    StopServer();
    loop_.reset();  // ends requests still in the engine while the service is alive
    worker_.reset();
  }

  absl::Status Start(const config::TandemConfig& c, engine::ComputeShare* share,
                     const config::WorkerConfig& wc, const char* name, metrics::Metrics& metrics,
                     bool prefill) {
    TANDEM_RETURN_IF_ERROR(Secure(c, prefill ? "prefill" : "decode", metrics));
    if (share == nullptr) own_pool_ = std::make_unique<ThreadPool>(c.model.threads);
    ThreadPool& pool = share != nullptr ? share->pool() : *own_pool_;
    model::WeightLoadOptions load;
    TANDEM_ASSIGN_OR_RETURN(load.memory, model::ParseWeightMemory(c.model.weight_memory));
    TANDEM_ASSIGN_OR_RETURN(load.device, kernels::ParseDevice(c.model.device));
    TANDEM_ASSIGN_OR_RETURN(load.cpu_gemm, kernels::ParseCpuGemm(c.model.cpu_gemm));
    TANDEM_ASSIGN_OR_RETURN(load.quantize,
                            model::ParseWeightQuantization(c.model.weight_quantization,
                                                           c.model.weight_quantization_group_size,
                                                           c.model.activation_quantization));
    TANDEM_ASSIGN_OR_RETURN(
        load.lm_head_quantize,
        model::ParseLmHeadQuantization(c.model.lm_head_quantization, load.quantize));
    {
      // Packing the weights computes on the pool too.
      std::optional<engine::ComputeShare::Turn> turn;
      if (share != nullptr) {
        turn.emplace(share->Acquire(prefill ? engine::Phase::kPrefill : engine::Phase::kDecode));
      }
      TANDEM_ASSIGN_OR_RETURN(model_, model::Model::Load(c.model.path, pool, load));
    }
    TANDEM_ASSIGN_OR_RETURN(engine::EngineOptions options,
                            EngineOptionsFor(c, model_->config(), prefill));
    TANDEM_ASSIGN_OR_RETURN(auto engine, engine::Engine::Create(*model_, options));
    const engine::ExportPlan export_plan = engine::ExportPlan::Of(*engine);
    const std::string role = prefill ? "prefill" : "decode";  // the metrics' role label
    if (load.device.kind == kernels::DeviceSpec::Kind::kCpu) {
      metrics.CpuGemmInfo(role, std::string(kernels::CpuGemmName(model_->weights().gemm)),
                          kernels::OnednnCpuInfo().isa);
    }
    if (model_->kv_memory() != nullptr) {  // on a device: what its memory holds
      metrics.DeviceMemory(role, "weights")
          ->Set(static_cast<double>(model_->backend().resident_bytes()));
      metrics.DeviceMemory(role, "kv_cache")
          ->Set(static_cast<double>(engine->kv_cache().pool_bytes()));
    }
    loop_ = std::make_unique<engine::EngineLoop>(
        std::move(engine), share, prefill ? engine::Phase::kPrefill : engine::Phase::kDecode);
    store::StorePoolOptions shards = StoreTransport(c, role);
    shards.chunk_bytes = c.cache_store.chunk_bytes;
    shards.transport = transport_;
    shards.on_transfer = [m = metrics.KvTransports(role)](const store::TransferSample& s) {
      m.Observe(s.transport, s.put, s.ok, s.bytes, s.seconds);
    };
    store_ = std::make_unique<store::StorePool>(c.cache_store.shards, ModelId(c), shards);
    store_->ConnectInBackground();
    if (prefill) {
      prefill::PrefillWorkerOptions o;
      if (options.pruning.enabled) {
        o.pruned_layers =
            model::PrunedLayers(options.pruning.settings, model_->config().num_layers);
        o.stability_sample_rate = c.kv_cache_optimization.monitor_sample_rate;
        o.stability_alert_below = c.kv_cache_optimization.monitor_alert_below;
      }
      o.authorizer = authorizer_.get();
      if (c.cache_store.reserve_ahead) o.reserve_ahead = export_plan;
      o.load_prefixes = c.cache_store.load_prefixes;
      worker_ = std::make_unique<prefill::PrefillWorker>(*loop_, *store_, metrics, o);
    } else {
      worker_ = std::make_unique<decode::DecodeWorker>(*loop_, *store_, metrics, *authorizer_,
                                                       c.scheduler.stream_interval);
    }
    TANDEM_ASSIGN_OR_RETURN(auto server, rpc::StartServer(wc.listen, {worker_->service()}, {name},
                                                          {.transport = transport_.get()}));
    Serve(std::move(server), {name});
    rpc::WorkerAgentOptions agent;
    agent.router = wc.router;
    agent.transport = transport_;
    agent.registration.set_address(rpc::AdvertisedAddress(wc.advertise, address()));
    agent.registration.set_model_id(ModelId(c));
    TANDEM_ASSIGN_OR_RETURN(*agent.registration.mutable_layout(),
                            KvLayoutMessage(c, model_->config(), model_->weights().fingerprint));
    agent.registration.mutable_layout()->set_kernels(model_->weights().kernels);
    // A worker the router refuses (another model or KV layout) is not ready until it is
    // accepted, so the refusal shows in its readiness probe as well as its log.
    agent.on_accepted = [this](bool accepted) { SetReady(accepted); };
    worker_->StartAgent(std::move(agent));
    return absl::OkStatus();
  }

 private:
  std::unique_ptr<ThreadPool> own_pool_;  // without a shared pool
  std::unique_ptr<model::Model> model_;
  std::unique_ptr<store::StorePool> store_;
  std::unique_ptr<engine::EngineLoop> loop_;
  std::unique_ptr<rpc::Worker> worker_;
};

class RouterRole final : public ServedRole {
 public:
  ~RouterRole() override {
    if (service_ != nullptr) service_->BeginShutdown();
    http_.reset();  // HTTP requests still in flight are aborted
    // Streams still in flight (past router.drain_seconds) get a moment, then are cancelled.
    StopServer(std::chrono::seconds(1));
  }

  // New requests get UNAVAILABLE and health turns NOT_SERVING at once; requests in flight get
  // up to router.drain_seconds to finish before the server stops.
  void Drain() override {
    service_->BeginShutdown();
    ServedRole::Drain();
    const auto end = std::chrono::steady_clock::now() +
                     std::chrono::duration_cast<std::chrono::steady_clock::duration>(drain_);
    while (std::chrono::steady_clock::now() < end) {
      const router::RouterService::Load load = service_->GetLoad();
      if (load.waiting == 0 && load.running == 0) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  absl::Status Start(const config::TandemConfig& c, metrics::Metrics& metrics,
                     bool workers_in_process) {
    TANDEM_RETURN_IF_ERROR(Secure(c, "router", metrics));
    TANDEM_ASSIGN_OR_RETURN(model::ModelConfig m, model::ModelConfig::FromDirectory(c.model.path));
    if (std::filesystem::exists(std::filesystem::path(c.model.path) / "tokenizer.json")) {
      TANDEM_ASSIGN_OR_RETURN(tokenizer_, tokenizer::Tokenizer::Load(c.model.path));
    }
    router::RouterOptions o;
    o.model_name = ModelId(c);
    o.architecture = m.architecture_name;
    TANDEM_ASSIGN_OR_RETURN(DType kv_dtype, KvDType(c, m));
    // The workers' block hashes cover their weights' fingerprint; the prefix index must hash
    // alike to find what they hold.
    absl::StatusOr<uint64_t> fingerprint = model::WeightsFingerprint(c.model.path);
    if (!fingerprint.ok()) {
      Log(LogLevel::kWarning, "router",
          absl::StrCat("no weights to fingerprint (", fingerprint.status().message(),
                       "): prefix-aware routing will not match the workers' KV blocks"));
    }
    TANDEM_ASSIGN_OR_RETURN(o.kv_layout, KvLayoutMessage(c, m, fingerprint.value_or(0)));
    o.kv_dtype = o.kv_layout.dtype();
    o.model_id = ModelId(c);
    o.limits = {.context_length = m.max_position_embeddings,
                .vocab_size = static_cast<int32_t>(m.vocab_size),
                .max_prompt_tokens = c.router.max_prompt_tokens,
                .max_tokens = c.router.max_tokens,
                .max_stop_strings = c.router.max_stop_strings,
                .max_stop_bytes = c.router.max_stop_bytes,
                .max_logprobs = c.router.max_logprobs};
    o.eos_token_ids = m.eos_token_ids;
    if (tokenizer_ != nullptr && tokenizer_->eos_id() >= 0) {
      o.eos_token_ids.push_back(tokenizer_->eos_id());
    }
    o.block_size = c.kv_cache.block_size;
    o.kv_bytes_per_block =
        static_cast<int64_t>(m.KvLayoutFor(kv_dtype, c.kv_cache.block_size).BlockBytes());
    o.max_queued_requests = c.router.max_queued_requests;
    o.max_queued_tokens = c.router.max_queued_tokens;
    o.default_deadline = std::chrono::duration<double>(c.router.default_deadline_seconds);
    o.grpc_write_timeout = std::chrono::milliseconds(
        static_cast<int64_t>(c.router.grpc_write_timeout_seconds * 1000));
    o.balancer = {.hit_rate_threshold = c.balancer.hit_rate_threshold,
                  .hysteresis = c.balancer.hysteresis,
                  .window = std::chrono::duration<double>(c.balancer.window_seconds),
                  .min_lookups = c.balancer.min_lookups};
    o.max_prefill_ahead_bytes = c.balancer.max_prefill_ahead_bytes;
    o.pool.block_size = c.kv_cache.block_size;
    o.pool.keepalive =
        std::chrono::milliseconds(static_cast<int64_t>(c.router.worker_keepalive_seconds * 1000));
    o.pool.forget_after = std::chrono::milliseconds(
        static_cast<int64_t>(c.router.forget_workers_after_seconds * 1000));
    o.pool.transport = workers_in_process ? security::Transport::Insecure() : transport_;
    if (!c.security.api_keys_file.empty()) {
      TANDEM_ASSIGN_OR_RETURN(
          api_keys_,
          security::ApiKeys::Load(c.security.api_keys_file,
                                  {.max_concurrent = c.security.api_key_max_concurrent,
                                   .tokens_per_minute = c.security.api_key_tokens_per_minute},
                                  &metrics));
      o.api_keys = api_keys_.get();
    }
    o.cache_salt_per_key = c.security.cache_salt_per_key;
    o.colocated = c.router.mode == "colocated";
    o.workload_window = std::chrono::duration<double>(c.planner.window_seconds);
    drain_ = std::chrono::duration<double>(c.router.drain_seconds);
    service_ = std::make_unique<router::RouterService>(o, tokenizer_.get(), &metrics);
    // The recommended replicas are exported (0) even without a planner, so an autoscaler
    // following them has its metric and is never held up by it.
    metrics.planner(o.colocated);
    if (!c.planner.profile.empty()) TANDEM_RETURN_IF_ERROR(StartPlanner(c, metrics));
    for (const auto& a : c.router.prefill_workers) service_->prefill_pool().Add(a);
    for (const auto& a : c.router.decode_workers) service_->decode_pool().Add(a);
    registry_ = std::make_unique<router::RegistryService>(
        *service_, std::chrono::duration<double>(c.router.heartbeat_interval_seconds), &metrics,
        *authorizer_);
    // Public clients present no certificate; workers registering present theirs.
    TANDEM_ASSIGN_OR_RETURN(auto server,
                            rpc::StartServer(c.router.listen, {service_.get(), registry_.get()},
                                             {kInference, kRegistry},
                                             {.transport = transport_.get(),
                                              .clients = security::ClientCertificates::kOptional,
                                              .max_receive_bytes = c.router.max_request_bytes}));
    Serve(std::move(server), {kInference, kRegistry});
    if (!c.router.http_listen.empty()) TANDEM_RETURN_IF_ERROR(StartHttp(c, m));
    return absl::OkStatus();
  }

  std::string http_address() const override { return http_address_; }

 private:
  // The planner advisor: sizes this router's deployment shape for the workload it measures.
  absl::Status StartPlanner(const config::TandemConfig& c, metrics::Metrics& metrics) {
    router::PlannerAdvisorOptions o;
    TANDEM_ASSIGN_OR_RETURN(std::string text, ReadFileToString(c.planner.profile));
    TANDEM_ASSIGN_OR_RETURN(o.profile, planner::EngineProfile::FromJson(text, c.planner.profile));
    o.slo.slo_ttft_s = c.planner.slo_ttft_ms / 1e3;
    o.slo.slo_tpot_s = c.planner.slo_tpot_ms / 1e3;
    o.slo.attainment = c.planner.attainment;
    o.slo.num_requests = 400;
    const bool colocated = c.router.mode == "colocated";
    planner::RecommendOptions& r = o.recommend;
    r.disaggregated = !colocated;
    r.engine = {
        .max_num_seqs = c.scheduler.max_num_seqs,
        .max_num_batched_tokens = c.scheduler.max_num_batched_tokens,
        .chunk_size = c.scheduler.chunk_size,
        .num_blocks = c.kv_cache.memory_bytes /
                      std::max<int64_t>(1, o.profile.kv_bytes_per_token * o.profile.block_size),
        .stream_interval = c.scheduler.stream_interval};
    r.prefill = r.engine;
    bool fell_back = false;
    r.transport = planner::PlannedTransport(o.profile, c.cache_store.transport,
                                            c.cache_store.shared_memory, &fell_back);
    if (fell_back) {
      Log(LogLevel::kWarning, "router",
          "planner: " + c.planner.profile +
              " has no kv_transfer samples for the UCX fabric (kv-handoff-bench --profile P "
              "--paths ucx-tcp measures them); the handoff is planned at the gRPC stream's rate");
    }
    r.max_replicas = c.planner.max_replicas;
    r.headroom = c.planner.headroom;
    o.interval = std::chrono::duration<double>(c.planner.interval_seconds);
    o.min_requests = c.planner.min_requests;
    o.shared_stack_cpu = c.planner.shared_stack_cpu;
    o.correction = c.planner.correction;
    o.correction_smoothing = c.planner.correction_smoothing;
    // The replicas in rotation, which the measured TTFT and TPOT are of (colocated workers
    // register in the decode pool).
    router::RouterService* service = service_.get();
    o.live = [service] {
      return router::LiveReplicas{.prefill = service->prefill_pool().available(),
                                  .decode = service->decode_pool().available()};
    };
    Log(LogLevel::kInfo, "router",
        absl::StrCat("planner: sizing the ", colocated ? "colocated" : "disaggregated",
                     " deployment every ", c.planner.interval_seconds, " s with profile ",
                     c.planner.profile, " (", o.profile.model, ", ", o.profile.weights, ")"));
    planner_ = std::make_unique<router::PlannerAdvisor>(
        std::move(o), service_->workload(), &metrics.planner(colocated), service_->clock());
    planner_->Start();
    return absl::OkStatus();
  }

  absl::Status StartHttp(const config::TandemConfig& c, const model::ModelConfig& m) {
    // A model without a chat template (or with one Tandem cannot run) still serves
    // completions; chat requests are refused, saying why.
    absl::StatusOr<chat::ChatTemplateConfig> chat = chat::LoadChatTemplateFromDir(c.model.path);
    if (!chat.ok() && chat.status().code() != absl::StatusCode::kNotFound) {
      Log(LogLevel::kWarning, "router",
          absl::StrCat("the model's chat template cannot be served: ", chat.status().message()));
    }
    door_ = std::make_unique<router::OpenAiDoor>(
        *service_,
        router::OpenAiLimits{.model_name = ModelId(c),
                             .context_length = m.max_position_embeddings,
                             .max_n = c.router.max_n,
                             .max_logprobs = c.router.max_logprobs,
                             .health_needs_key = c.security.health_needs_key},
        std::move(chat));
    const auto seconds = [](double s) {
      return std::chrono::milliseconds(static_cast<int64_t>(s * 1000));
    };
    TANDEM_ASSIGN_OR_RETURN(
        http_, router::HttpServer::Start(
                   {.listen = c.router.http_listen,
                    .threads = c.router.http_threads,
                    .max_header_bytes = static_cast<size_t>(c.router.http_max_header_bytes),
                    .max_body_bytes = static_cast<size_t>(c.router.http_max_body_bytes),
                    .read_timeout = seconds(c.router.http_read_timeout_seconds),
                    .write_timeout = seconds(c.router.http_write_timeout_seconds),
                    // HTTPS with the router's certificate when the roles use TLS.
                    .tls_cert_file = c.security.tls.cert_file,
                    .tls_key_file = c.security.tls.key_file,
                    .cors_origins = c.router.http_cors_origins,
                    .on_client_cut_off =
                        [counter = service_->environment().http_metrics.stalled_streams] {
                          if (counter != nullptr) counter->Increment();
                        },
                    .refusal_body = &router::OpenAiDoor::RefusalBody},
                   [door = door_.get()](router::HttpRequest request,
                                        std::shared_ptr<router::HttpResponder> responder) {
                     door->Handle(std::move(request), std::move(responder));
                   }));
    const std::string host = c.router.http_listen.substr(0, c.router.http_listen.rfind(':'));
    http_address_ = absl::StrCat(host, ":", http_->port());
    return absl::OkStatus();
  }

  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  std::unique_ptr<security::ApiKeys> api_keys_;  // outlives the service
  std::unique_ptr<router::RouterService> service_;
  std::unique_ptr<router::OpenAiDoor> door_;
  std::unique_ptr<router::HttpServer> http_;  // after door_: stops before it
  std::string http_address_;
  std::unique_ptr<router::RegistryService> registry_;
  std::unique_ptr<router::PlannerAdvisor> planner_;  // after service_: stops before it
  std::chrono::duration<double> drain_{30};
};

}  // namespace

std::string ModelId(const config::TandemConfig& config) {
  if (!config.model.name.empty()) return config.model.name;
  std::filesystem::path p(config.model.path);
  if (!p.has_filename()) p = p.parent_path();
  return p.filename().string();
}

absl::StatusOr<std::shared_ptr<const security::Transport>> RoleTransport(
    const config::TandemConfig& c, const std::string& role, metrics::Metrics* metrics) {
  const config::SecurityConfig& s = c.security;
  const bool tls = !s.tls.ca_file.empty();
  const std::string& listen = role == "router"    ? c.router.listen
                              : role == "prefill" ? c.prefill.listen
                              : role == "decode"  ? c.decode.listen
                                                  : c.cache_store.listen;
  const std::string key = role == "cache-store" ? "cache_store.listen" : role + ".listen";
  TANDEM_RETURN_IF_ERROR(security::CheckListener(key, listen, tls, s.allow_insecure));
  if (role == "router") {
    TANDEM_RETURN_IF_ERROR(
        security::CheckListener("router.http_listen", c.router.http_listen, tls, s.allow_insecure));
  }
  if (!tls) return security::Transport::Insecure();
  TANDEM_ASSIGN_OR_RETURN(std::shared_ptr<const security::Transport> transport,
                          security::Transport::Create({.ca_file = s.tls.ca_file,
                                                       .cert_file = s.tls.cert_file,
                                                       .key_file = s.tls.key_file,
                                                       .role_uri_prefix = s.role_uri_prefix,
                                                       .reload_seconds = s.tls.reload_seconds,
                                                       .metrics = metrics}));
  const std::string want = role == "cache-store" ? "cache_store" : role;
  if (security::RoleName(*transport->own_role()) != want) {
    return absl::InvalidArgumentError(absl::StrCat(
        "security.tls.cert_file: ", s.tls.cert_file, " is a ",
        security::RoleName(*transport->own_role()), " certificate; this process runs ", want));
  }
  return transport;
}

std::vector<std::string> HealthNames(const std::string& role) {
  if (role == "router") return {kInference, kRegistry};
  if (role == "prefill") return {kPrefill};
  if (role == "decode") return {kDecode};
  return {kCacheStore};
}

absl::StatusOr<std::unique_ptr<Role>> StartCacheStore(const config::TandemConfig& config,
                                                      metrics::Metrics& metrics) {
  auto role = std::make_unique<CacheStoreRole>();
  TANDEM_RETURN_IF_ERROR(role->Start(config, metrics));
  return role;
}

absl::StatusOr<std::unique_ptr<Role>> StartPrefill(const config::TandemConfig& config,
                                                   engine::ComputeShare* share,
                                                   metrics::Metrics& metrics) {
  auto role = std::make_unique<WorkerRole>();
  TANDEM_RETURN_IF_ERROR(
      role->Start(config, share, config.prefill, kPrefill, metrics, /*prefill=*/true));
  return role;
}

absl::StatusOr<std::unique_ptr<Role>> StartDecode(const config::TandemConfig& config,
                                                  engine::ComputeShare* share,
                                                  metrics::Metrics& metrics) {
  auto role = std::make_unique<WorkerRole>();
  TANDEM_RETURN_IF_ERROR(
      role->Start(config, share, config.decode, kDecode, metrics, /*prefill=*/false));
  return role;
}

absl::StatusOr<std::unique_ptr<Role>> StartRouter(const config::TandemConfig& config,
                                                  metrics::Metrics& metrics,
                                                  bool workers_in_process) {
  auto role = std::make_unique<RouterRole>();
  TANDEM_RETURN_IF_ERROR(role->Start(config, metrics, workers_in_process));
  return role;
}

}  // namespace tandem::cli
