// The public Inference API (DESIGN.md, "Request path"): validates and tokenizes each request,
// admits it under the queue limits, sends it to a prefill worker and then to a decode worker,
// and streams text back. Worker failures are absorbed here: a failed prefill is retried on
// another worker; a decode worker that dies mid-stream has its requests re-prefilled (prompt +
// tokens so far) and continued elsewhere, so the client sees one uninterrupted stream.
//
// The balancer (router/balancer.h) watches the decode hit rate; while it is engaged, decode
// workers report misses instead of recomputing, those requests are re-prefilled at high
// priority, and prefill is paced: new prefills wait while the KV bytes prefilled but not yet
// admitted by decode exceed `max_prefill_ahead_bytes`.
//
// Threads: gRPC callback threads only; per-request state is in GenerateCall (generate_call.h).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics/metrics.h"
#include "common/tokenizer/tokenizer.h"
#include "router/balancer.h"
#include "router/request_validation.h"
#include "router/worker_pool.h"
#include "tandem/v1/inference.grpc.pb.h"
#include "tandem/v1/kv.pb.h"

namespace tandem::router {

class CallState;

struct RouterOptions {
  std::string model_name;
  std::string architecture;
  std::string kv_dtype;
  std::string model_id;  // enters every block hash (must match the workers')
  ModelLimits limits;
  std::vector<int32_t> eos_token_ids;
  int block_size = 16;
  int64_t kv_bytes_per_block = 0;
  // The KV cache every worker must hold (dtype "mixed" for a mixed-precision cache): the registry
  // refuses a worker that reports another. An empty dtype checks nothing.
  tandem::v1::KvLayout kv_layout;
  int max_queued_requests = 1024;
  int64_t max_queued_tokens = 1 << 20;
  std::chrono::duration<double> default_deadline = std::chrono::seconds(600);
  // Colocated: decode workers run whole requests (prefill included); prefill is skipped.
  bool colocated = false;
  int max_attempts = 4;  // prefill and decode attempts per request (retries, migrations)
  BalancerOptions balancer;
  int64_t max_prefill_ahead_bytes = int64_t{256} << 20;
  WorkerPoolOptions pool;
};

// Generate is taken as raw bytes (see ParseGenerateRequest) so invalid UTF-8 is answered
// INVALID_ARGUMENT rather than failing inside gRPC's parser.
class RouterService final : public tandem::v1::Inference::WithRawCallbackMethod_Generate<
                                tandem::v1::Inference::CallbackService> {
 public:
  // `tokenizer` may be null (token-id prompts only); `metrics` may be null. Both must outlive
  // the service.
  RouterService(const RouterOptions& options, const tokenizer::Tokenizer* tokenizer,
                metrics::Metrics* metrics);

  WorkerPool& prefill_pool() { return prefill_pool_; }
  WorkerPool& decode_pool() { return decode_pool_; }
  Balancer& balancer() { return balancer_; }
  const RouterOptions& options() const { return options_; }

  // New requests get UNAVAILABLE from now on; those in flight continue.
  void BeginShutdown() { shutting_down_ = true; }

  struct Load {
    int64_t waiting = 0;  // admitted, not yet streaming from a decode worker
    int64_t waiting_tokens = 0;
    int64_t running = 0;  // streaming from a decode worker
    int64_t paced = 0;    // held back by the balancer's pacing
  };
  Load GetLoad() const;

  grpc::ServerWriteReactor<grpc::ByteBuffer>* Generate(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* context,
                                         const tandem::v1::GetModelInfoRequest* request,
                                         tandem::v1::ModelInfo* response) override;

 private:
  friend class CallState;

  // Admission: RESOURCE_EXHAUSTED past the queue limits, UNAVAILABLE while shutting down.
  absl::Status Admit(int64_t tokens);
  void StartRunning(int64_t tokens);  // waiting -> running
  void Leave(bool running, int64_t tokens);

  // Runs `call`'s prefill now, or once pacing allows (high priority never waits). `bytes` are
  // its prompt's KV bytes, counted until PrefillAdmitted.
  void SchedulePrefill(std::shared_ptr<CallState> call, int64_t bytes, bool high_priority);
  // The prefilled KV has been taken up by decode (or is no longer needed).
  void PrefillAdmitted(int64_t bytes);

  const RouterOptions options_;
  const tokenizer::Tokenizer* const tokenizer_;
  metrics::RoleMetrics metrics_;  // all null without a registry
  WorkerPool prefill_pool_;
  WorkerPool decode_pool_;
  Balancer balancer_;
  uint64_t model_hash_;
  std::atomic<bool> shutting_down_{false};
  std::atomic<int64_t> next_id_{1};

  mutable absl::Mutex mu_;
  int64_t waiting_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t waiting_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t running_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t ahead_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  struct Paced {
    std::shared_ptr<CallState> call;
    int64_t bytes;
  };
  std::deque<Paced> paced_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::router
