// The prefill worker's gRPC service (workers.proto, PrefillWorker): runs a prompt through its
// engine up to the first token, writes the prompt's full KV blocks to the cache store and
// answers with the first token and the KV handle.
//
// Threads: gRPC callbacks submit to the EngineLoop; the loop's callback exports the blocks
// (between steps, so nothing evicts them first) and hands the upload to a WorkQueue, whose
// thread finishes the RPC. A cancelled or expired call aborts its request in the engine. With
// load_prefixes, a fetch thread first brings the prompt's blocks that the store holds and the
// engine does not into the engine's prefix cache (as decode does), so prefill computes only the
// rest.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/engine/engine_loop.h"
#include "common/engine/kv_handoff.h"
#include "common/model/pruning_check.h"
#include "common/rpc/worker_agent.h"
#include "common/security/authorizer.h"
#include "common/store/store_pool.h"
#include "common/util/work_queue.h"
#include "tandem/v1/workers.grpc.pb.h"

namespace tandem::prefill {

struct PrefillServiceOptions {
  int upload_threads = 2;
  // Called with the seconds each request's upload to the store took (the role's
  // tandem_kv_transfer_seconds); may be empty.
  std::function<void(double)> on_transfer;
  // POP's attention-stability monitor: this fraction of requests (spread evenly) has its prompt
  // checked with model::CheckAttentionStability on the engine loop, right after its own step,
  // and the result passed to on_stability. Needs an engine that prunes. The check is queued on
  // the loop with a reference to the service: destroy the loop (which runs queued tasks)
  // before the service.
  double stability_sample_rate = 0;
  std::function<void(const std::vector<model::LayerSimilarity>&)> on_stability;
  // Which roles may call the service; must outlive it.
  const security::Authorizer* authorizer = &security::Authorizer::Open();
  // The engine's ExportPlan (taken before the loop owns it). With it, each prompt's blocks get
  // their store space reserved as the request is admitted, on the upload threads while the
  // engine computes (StorePool::Reserve), so the upload after prefill costs one round trip per
  // shard (Commit) instead of three (Exists, Reserve, Commit). Without it, or where the sizes
  // are not known ahead (a mixed-precision cache), the upload does it all.
  std::optional<engine::ExportPlan> reserve_ahead;
  // Look up each prompt's blocks in the store (memory or disk tier) before computing it, and
  // compute only what no one stored: a prefix another prefill worker computed, or one this
  // worker has since evicted.
  bool load_prefixes = false;
  int fetch_threads = 2;
  // Called with the seconds each prompt spent on that before it was queued to compute (the
  // fetch queue, the lookups and the import; tandem_prefix_lookup_seconds); may be empty.
  std::function<void(double)> on_prefix_lookup;
};

// Longest prompt the stability monitor samples.
inline constexpr int64_t kMaxStabilityCheckTokens = 8192;

class PrefillService final : public tandem::v1::PrefillWorker::CallbackService,
                             public rpc::WorkerCounters {
 public:
  // `loop` and `store` must outlive the service.
  PrefillService(engine::EngineLoop& loop, store::StorePool& store,
                 const PrefillServiceOptions& options = {});

  grpc::ServerUnaryReactor* Prefill(grpc::CallbackServerContext* context,
                                    const tandem::v1::PrefillRequest* request,
                                    tandem::v1::PrefillResponse* response) override;

  int64_t kv_bytes() const override { return kv_bytes_.load(); }  // uploaded to the store
  // Uploads that went through a reservation made ahead (reserve_ahead) on some shard, and all
  // uploads.
  int64_t reserved_uploads() const { return reserved_uploads_.load(); }
  int64_t uploads() const { return uploads_done_.load(); }
  // load_prefixes: prompt blocks found in the store and imported instead of computed.
  int64_t loaded_blocks() const { return loaded_blocks_.load(); }
  // load_prefixes: each prompt's full blocks looked up before it is computed, hits by where
  // they were (the worker's cache, the store's memory, its disk tier; a block after the first
  // one missing counts as missed, as it cannot be used).
  bool counts_lookups() const override { return load_prefixes_; }
  int64_t kv_hits() const override {
    return kv_worker_hits_.load() + kv_memory_hits_.load() + kv_disk_hits_.load();
  }
  int64_t kv_misses() const override { return kv_misses_.load(); }
  int64_t kv_worker_hits() const override { return kv_worker_hits_.load(); }
  int64_t kv_store_memory_hits() const override { return kv_memory_hits_.load(); }
  int64_t kv_store_disk_hits() const override { return kv_disk_hits_.load(); }

 private:
  friend class PrefillCall;
  engine::EngineLoop& loop_;
  store::StorePool& store_;
  WorkQueue uploads_;
  const std::function<void(double)> on_transfer_;
  const security::Authorizer& authorizer_;
  const double stability_sample_rate_;
  const std::function<void(const std::vector<model::LayerSimilarity>&)> on_stability_;
  const std::optional<engine::ExportPlan> reserve_ahead_;
  const bool load_prefixes_;
  const std::function<void(double)> on_prefix_lookup_;
  std::unique_ptr<WorkQueue> fetches_;  // with load_prefixes
  std::atomic<int64_t> prefilled_{0};  // requests that reached their first token
  std::atomic<int64_t> next_id_{1};
  std::atomic<int64_t> kv_bytes_{0};
  std::atomic<int64_t> reserved_uploads_{0};
  std::atomic<int64_t> uploads_done_{0};
  std::atomic<int64_t> loaded_blocks_{0};
  std::atomic<int64_t> kv_worker_hits_{0};
  std::atomic<int64_t> kv_memory_hits_{0};
  std::atomic<int64_t> kv_disk_hits_{0};
  std::atomic<int64_t> kv_misses_{0};
};

}  // namespace tandem::prefill
