// One Generate request inside the router: its reactor (GenerateCall) and its state
// (CallState), which outlives the reactor because worker callbacks hold it.
//
// CallState runs the request path: prefill on a worker the pool picks, then decode, retrying a
// failed prefill elsewhere and migrating off a decode worker that fails mid-stream (prompt +
// tokens so far are re-prefilled). Client cancel and deadlines cancel the worker call in
// flight.
//
// Threads: every method may run on any gRPC thread. `mu_` guards the mutable state; what is
// const was fixed before the call was shared. Nothing that calls out (an RPC, the pacer, which
// may start other calls' prefills, the request queue) runs under `mu_`: code holding it queues
// such work in `deferred_`, and Lock runs it after unlocking. Under `mu_` a call uses only the
// leaf parts of CallEnvironment (pools, balancer, metrics).
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics/token_timing.h"
#include "common/rpc/server_stream.h"
#include "common/security/api_keys.h"
#include "router/call_environment.h"
#include "router/output_assembler.h"
#include "router/response_sink.h"
#include "router/stream_watchdog.h"
#include "tandem/v1/inference.grpc.pb.h"
#include "tandem/v1/workers.grpc.pb.h"

namespace tandem::router {

// A request that passed validation and admission (it is counted as waiting).
struct AdmittedRequest {
  Clock::time_point arrival;  // when the router received it (TTFT and queue time count from here)
  std::string id;
  std::vector<int32_t> prompt;
  std::vector<uint64_t> hashes;  // chained block hashes of the prompt, from cache_salt
  uint64_t cache_salt = 0;       // the request's tenant (kv::CacheSaltOf); 0: none
  tandem::v1::SamplingParams sampling;
  Door door = Door::kGrpc;
  // The API key's hold on its quota (null without API keys): the tokens the request used are
  // added to it, and it is let go, when the request leaves the router.
  std::shared_ptr<security::KeyLease> lease;
};

// Validates and admits a Generate request that arrived at `arrival`: INVALID_ARGUMENT for bad
// fields, RESOURCE_EXHAUSTED past the queue limits, UNAVAILABLE while the router shuts down.
// `key_name`: the API key the request came with ("" without one); with
// RouterOptions::cache_salt_per_key it salts the request's cache blocks.
absl::StatusOr<AdmittedRequest> AdmitRequest(const CallEnvironment& env,
                                             tandem::v1::GenerateRequest request,
                                             Clock::time_point arrival, Door door,
                                             const std::string& key_name = "");

// Admits `request` and starts it; its responses go to `sink`. Whichever door a request came
// in by, it runs here. On error nothing was started and `sink` is untouched.
absl::StatusOr<std::shared_ptr<class CallState>> StartCall(
    const CallEnvironment& env, tandem::v1::GenerateRequest request,
    std::shared_ptr<ResponseSink> sink, std::chrono::system_clock::time_point deadline,
    Clock::time_point arrival, Door door, std::shared_ptr<security::KeyLease> lease = nullptr);

class CallState : public std::enable_shared_from_this<CallState> {
 public:
  CallState(const CallEnvironment& env, std::shared_ptr<ResponseSink> sink,
            std::chrono::system_clock::time_point deadline, AdmittedRequest request);

  // Schedules the prefill (through the pacer).
  void Start() ABSL_LOCKS_EXCLUDED(mu_);
  // The client went away or the deadline passed.
  void Cancel() ABSL_LOCKS_EXCLUDED(mu_);

  const std::string& id() const { return id_; }

  // Decode stream events (from DecodeReader).
  // Returns false when the stream should be cancelled (the request ended at the router).
  bool OnDecodeMessage(const tandem::v1::DecodeResponse& message);
  // `charged`: the tokens the decode pool counted for this call (WorkerPool::Begin).
  void OnDecodeDone(Worker* worker, int64_t charged, const grpc::Status& status);

 private:
  struct Attempt;
  class Lock;
  enum class Phase { kWaiting, kPrefill, kDecode, kDone };

  // Asks the pacer to run the prefill of `bytes` more KV bytes; runs whatever it lets through.
  void SchedulePrefill(int64_t bytes, bool high_priority) ABSL_LOCKS_EXCLUDED(mu_);
  // Ends this call's pacer entry (decode took its KV up, or the call ended).
  void ReleasePacing() ABSL_LOCKS_EXCLUDED(mu_);
  void RunPrefill(bool high_priority) ABSL_LOCKS_EXCLUDED(mu_);
  void OnPrefillDone(Worker* worker, std::shared_ptr<Attempt> attempt, const grpc::Status& status)
      ABSL_LOCKS_EXCLUDED(mu_);
  void StartDecode(const tandem::v1::KvHandle& kv) ABSL_LOCKS_EXCLUDED(mu_);
  // Retries the request from prefill after `worker` failed with `status`; false when out of
  // attempts (the caller ends the stream).
  bool Retry(WorkerPool& pool, Worker* worker, const grpc::Status& status, bool high_priority)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Passes tokens to the client; finishes the request on a stop string, on `finish` or at
  // max_tokens. Returns true when the request has ended.
  // `logprobs`: one per token when the request asked for them, else empty.
  using Logprobs = google::protobuf::RepeatedPtrField<tandem::v1::TokenLogprobs>;
  bool Emit(const std::vector<int32_t>& tokens, const Logprobs& logprobs,
            tandem::v1::FinishReason finish) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Complete(tandem::v1::FinishReason reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends with an error status; safe to call once the phase is kDone (no-op).
  void Fail(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the request with `status`: the router's accounting, then the stream's end, both run
  // once mu_ is released.
  void LeaveRouter(grpc::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::unique_ptr<grpc::ClientContext> NewContext() const;
  std::vector<int32_t> AllTokens() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool IsEos(int32_t token) const;

  void Send(const tandem::v1::GenerateResponse& response) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    sink_->Push(response, deferred_);
  }

  const CallEnvironment& env_;
  const metrics::RoleMetrics& metrics_;  // of the door the request came in by
  const std::shared_ptr<ResponseSink> sink_;
  const std::chrono::system_clock::time_point deadline_;
  const Clock::time_point arrival_;
  const uint64_t key_;  // the pacer's key for this call
  const std::string id_;
  const std::vector<int32_t> prompt_;
  const std::vector<uint64_t> hashes_;  // chained block hashes of the prompt
  const uint64_t cache_salt_;
  const tandem::v1::SamplingParams sampling_;

  absl::Mutex mu_;
  // Work that must not run under mu_ (it calls into gRPC or back into this object), queued by
  // code holding mu_ and run, in order, when Lock releases it.
  std::vector<std::function<void()>> deferred_ ABSL_GUARDED_BY(mu_);
  Phase phase_ ABSL_GUARDED_BY(mu_) = Phase::kWaiting;
  bool running_ ABSL_GUARDED_BY(mu_) = false;  // counted as running by the router
  std::optional<OutputAssembler> output_ ABSL_GUARDED_BY(mu_);
  std::vector<int32_t> generated_ ABSL_GUARDED_BY(mu_);
  int attempts_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<Worker*> failed_prefill_ ABSL_GUARDED_BY(mu_);
  std::vector<Worker*> failed_decode_ ABSL_GUARDED_BY(mu_);
  bool rescheduled_ ABSL_GUARDED_BY(mu_) = false;  // re-prefilled once after misses
  bool first_decode_message_ ABSL_GUARDED_BY(mu_) = true;
  // The worker call in flight, cancelled with the request.
  std::shared_ptr<grpc::ClientContext> call_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<security::KeyLease> lease_ ABSL_GUARDED_BY(mu_);  // see AdmittedRequest
  // Usage and timings.
  int cached_prompt_tokens_ ABSL_GUARDED_BY(mu_) = -1;
  // sampling.prompt_logprobs: due in the first chunk, as the worker that prefilled reported
  // them.
  bool prompt_logprobs_due_ ABSL_GUARDED_BY(mu_) = false;
  Logprobs prompt_logprobs_ ABSL_GUARDED_BY(mu_);
  double queue_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  double prefill_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  double transfer_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  metrics::TokenTiming tokens_ ABSL_GUARDED_BY(mu_);  // TTFT and the gaps between chunks
};

// The gRPC door: a call's responses, serialized (Generate is a raw method, see RouterService).
class GrpcSink final : public ResponseSink, public WatchedStream {
 public:
  // `cut_off` (may be null) counts the streams CancelIfStalled cancels.
  GrpcSink(grpc::ServerWriteReactor<grpc::ByteBuffer>* reactor,
           grpc::CallbackServerContext* context, prometheus::Counter* cut_off)
      : stream_(reactor), context_(context), cut_off_(cut_off) {}
  void Push(const tandem::v1::GenerateResponse& response,
            std::vector<std::function<void()>>& after_unlock) override;
  void End(const grpc::Status& status) override { stream_.End(status); }
  bool CancelIfStalled(Clock::time_point now, Clock::duration timeout) override;
  rpc::ServerStream<grpc::ByteBuffer>& stream() { return stream_; }

 private:
  rpc::ServerStream<grpc::ByteBuffer> stream_;
  grpc::CallbackServerContext* const context_;  // valid until the stream finishes
  prometheus::Counter* const cut_off_;
};

// The server reactor of one Generate call.
class GenerateCall final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  // `lease`: the API key's (null without API keys).
  // `watchdog` watches the call's stream for a client that stops reading.
  GenerateCall(const CallEnvironment& env, grpc::CallbackServerContext* context,
               const grpc::ByteBuffer& request, std::shared_ptr<security::KeyLease> lease,
               StreamWatchdog& watchdog);
  void OnWriteDone(bool ok) override { sink_->stream().WriteDone(ok); }
  void OnCancel() override {
    if (state_ != nullptr) state_->Cancel();
  }
  void OnDone() override { delete this; }

 private:
  const std::shared_ptr<GrpcSink> sink_;
  std::shared_ptr<CallState> state_;  // null when the request was refused
};

}  // namespace tandem::router
