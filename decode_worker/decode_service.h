// The decode worker's gRPC service (workers.proto, DecodeWorker): takes a prompt whose KV was
// prefilled elsewhere, brings the handle's blocks into its engine (blocks already resident
// first, then the cache store), joins the continuous batch and streams tokens.
//
// Threads: a WorkQueue thread fetches blocks from the store; the EngineLoop imports them and
// runs the request; its callbacks queue messages that the gRPC reactor writes one at a time,
// each carrying up to scheduler.stream_interval tokens.
// Every lookup is a hit (resident or fetched) or a miss (recomputed); the counts go out with
// the first message and accumulate for the router's balancer.
#pragma once

#include <prometheus/histogram.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>

#include "common/engine/engine_loop.h"
#include "common/rpc/worker_agent.h"
#include "common/security/authorizer.h"
#include "common/store/store_pool.h"
#include "common/util/work_queue.h"
#include "tandem/v1/workers.grpc.pb.h"

namespace tandem::decode {

struct DecodeServiceOptions {
  int fetch_threads = 2;
  // How long a fetch thread waits for the engine loop to answer (which blocks are resident)
  // before it gives the request up with UNAVAILABLE, so a wedged or overloaded loop fails
  // requests (the router retries elsewhere) instead of holding fetch threads forever.
  std::chrono::milliseconds engine_timeout{30000};
  // scheduler.stream_interval: tokens gathered per message (the first and the last go at once).
  int stream_interval = 1;
  // Called with the seconds each request took to bring its blocks in (the role's
  // tandem_kv_transfer_seconds); may be empty.
  std::function<void(double)> on_transfer;
  // The role's tandem_time_to_first_token_seconds (from the Decode call's arrival) and
  // tandem_inter_token_latency_seconds, observed on the engine loop as each output is made, so
  // they leave out the stream to the router; may be null.
  prometheus::Histogram* time_to_first_token = nullptr;
  prometheus::Histogram* inter_token_latency = nullptr;
  // Which roles may call the service; must outlive it.
  const security::Authorizer* authorizer = &security::Authorizer::Open();
};

class DecodeService final : public tandem::v1::DecodeWorker::CallbackService,
                            public rpc::WorkerCounters {
 public:
  // `loop` and `store` must outlive the service; destroy the loop first.
  DecodeService(engine::EngineLoop& loop, store::StorePool& store,
                const DecodeServiceOptions& options = {});

  grpc::ServerWriteReactor<tandem::v1::DecodeResponse>* Decode(
      grpc::CallbackServerContext* context, const tandem::v1::DecodeRequest* request) override;

  bool counts_lookups() const override { return true; }
  int64_t kv_hits() const override { return kv_hits_.load(); }
  int64_t kv_misses() const override { return kv_misses_.load(); }
  int64_t kv_worker_hits() const override { return kv_worker_hits_.load(); }
  int64_t kv_store_memory_hits() const override { return kv_memory_hits_.load(); }
  int64_t kv_store_disk_hits() const override { return kv_disk_hits_.load(); }
  int64_t kv_bytes() const override { return kv_bytes_.load(); }  // fetched from the store

 private:
  friend class DecodeCall;

  // A request's block lookups: its hits, those of them the store served from each tier, misses.
  struct Lookups {
    int hits = 0, memory = 0, disk = 0, misses = 0;
    // `fetched`: indices of the hits that came from the store, each found in tiers[i].
    static Lookups Of(int hits, int misses, const std::vector<store::StoreTier>& tiers,
                      const std::vector<size_t>& fetched);
    void Fill(tandem::v1::DecodeResponse& first_message) const;
  };
  void Record(const Lookups& lookups);
  engine::EngineLoop& loop_;
  store::StorePool& store_;
  WorkQueue fetches_;
  const std::chrono::milliseconds engine_timeout_;
  const int stream_interval_;
  const std::function<void(double)> on_transfer_;
  prometheus::Histogram* const time_to_first_token_;
  prometheus::Histogram* const inter_token_latency_;
  const security::Authorizer& authorizer_;
  std::atomic<int64_t> kv_hits_{0};
  std::atomic<int64_t> kv_misses_{0};
  std::atomic<int64_t> kv_worker_hits_{0};
  std::atomic<int64_t> kv_memory_hits_{0};
  std::atomic<int64_t> kv_disk_hits_{0};
  std::atomic<int64_t> kv_bytes_{0};
  std::atomic<int64_t> next_id_{1};
};

}  // namespace tandem::decode
