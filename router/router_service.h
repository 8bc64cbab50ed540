// The public Inference API (DESIGN.md, "Request path"): validates and tokenizes each request,
// admits it under the queue limits, sends it to a prefill worker and then to a decode worker,
// and streams text back. Worker failures are absorbed here: a failed prefill is retried on
// another worker; a decode worker that dies mid-stream has its requests re-prefilled (prompt +
// tokens so far) and continued elsewhere, so the client sees one uninterrupted stream.
//
// The balancer (router/balancer.h) watches the decode hit rate; while it is engaged, decode
// workers report misses instead of recomputing, those requests are re-prefilled at high
// priority, and prefill is paced: new prefills wait while the KV bytes prefilled but not yet
// admitted by decode exceed `max_prefill_ahead_bytes` (router/prefill_pacer.h).
//
// Threads: gRPC callback threads, and whoever calls PollPacing; per-request state is in
// CallState (generate_call.h), which reaches the router only through CallEnvironment.
#pragma once

#include <atomic>
#include <cstdint>

#include "common/metrics/metrics.h"
#include "common/tokenizer/tokenizer.h"
#include "router/balancer.h"
#include "router/call_environment.h"
#include "router/prefill_pacer.h"
#include "router/request_queue.h"
#include "router/router_options.h"
#include "router/stream_watchdog.h"
#include "router/worker_pool.h"
#include "router/workload_stats.h"
#include "tandem/v1/inference.grpc.pb.h"

namespace tandem::router {

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
  WorkloadStats& workload() { return workload_; }
  const PrefillPacer& pacer() const { return pacer_; }
  const RouterOptions& options() const { return options_; }
  const TimeSource& clock() const { return env_.clock; }
  const tokenizer::Tokenizer* tokenizer() const { return tokenizer_; }
  // What every call shares: the other front doors start their calls with it (StartCall).
  const CallEnvironment& environment() const { return env_; }

  // New requests get UNAVAILABLE from now on; those in flight continue.
  void BeginShutdown() { shutting_down_ = true; }

  struct Load {
    int64_t waiting = 0;  // admitted, not yet streaming from a decode worker
    int64_t waiting_tokens = 0;
    int64_t running = 0;  // streaming from a decode worker
    int64_t paced = 0;    // held back by the balancer's pacing
  };
  Load GetLoad() const;

  // Starts the paced prefills that fit now; the registry calls it every heartbeat interval, so
  // they go once the balancer has disengaged even when no other request ends.
  void PollPacing();

  grpc::ServerWriteReactor<grpc::ByteBuffer>* Generate(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* context,
                                         const tandem::v1::GetModelInfoRequest* request,
                                         tandem::v1::ModelInfo* response) override;

 private:
  const RouterOptions options_;
  const tokenizer::Tokenizer* const tokenizer_;
  metrics::RoleMetrics metrics_;  // api="grpc"; all null without a registry
  metrics::RoleMetrics http_metrics_;  // api="http"
  WorkerPool prefill_pool_;
  WorkerPool decode_pool_;
  Balancer balancer_;
  WorkloadStats workload_;
  PrefillPacer pacer_;
  RequestQueue queue_;
  std::atomic<bool> shutting_down_{false};
  std::atomic<uint64_t> next_serial_{1};
  const CallEnvironment env_;  // refers to the parts above
  StreamWatchdog watchdog_;    // last: its sweeps reach the calls, which use env_
};

}  // namespace tandem::router
