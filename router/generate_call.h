// One Generate request inside the router: its reactor (GenerateCall) and its state
// (CallState), which outlives the reactor because worker callbacks hold it.
//
// CallState runs the request path: prefill on a worker the pool picks, then decode, retrying a
// failed prefill elsewhere and migrating off a decode worker that fails mid-stream (prompt +
// tokens so far are re-prefilled). Client cancel and deadlines cancel the worker call in
// flight. Every method may run on any gRPC thread; `mu_` guards the state, and no gRPC call
// is made while holding it.
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
#include "absl/synchronization/mutex.h"
#include "common/rpc/server_stream.h"
#include "router/output_assembler.h"
#include "router/router_service.h"
#include "tandem/v1/inference.grpc.pb.h"
#include "tandem/v1/workers.grpc.pb.h"

namespace tandem::router {

class CallState : public std::enable_shared_from_this<CallState> {
 public:
  CallState(RouterService& router, grpc::ServerWriteReactor<grpc::ByteBuffer>* reactor,
            std::chrono::system_clock::time_point deadline);

  // Parses, validates, admits and schedules the request (or ends the stream with the error).
  void Start(const grpc::ByteBuffer& request);
  // Called by the router once pacing lets the prefill run.
  void RunPrefill(bool high_priority);
  // The client went away or the deadline passed.
  void Cancel();

  rpc::ServerStream<grpc::ByteBuffer>& stream() { return stream_; }

  // Decode stream events (from DecodeReader).
  // Returns false when the stream should be cancelled (the request ended at the router).
  bool OnDecodeMessage(const tandem::v1::DecodeResponse& message);
  void OnDecodeDone(Worker* worker, const grpc::Status& status);

 private:
  struct Attempt;
  class Lock;
  enum class Phase { kWaiting, kPrefill, kDecode, kDone };

  void OnPrefillDone(Worker* worker, std::shared_ptr<Attempt> attempt, const grpc::Status& status);
  void StartDecode(const tandem::v1::KvHandle& kv);
  // Retries the request from prefill after `worker` failed with `status`; false when out of
  // attempts (the caller ends the stream).
  bool Retry(WorkerPool& pool, Worker* worker, const grpc::Status& status, bool high_priority)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Passes tokens to the client; finishes the request on a stop string, on `finish` or at
  // max_tokens. Returns true when the request has ended.
  bool Emit(const std::vector<int32_t>& tokens, tandem::v1::FinishReason finish)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Complete(tandem::v1::FinishReason reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends with an error status; safe to call once the phase is kDone (no-op).
  void Fail(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LeaveRouter() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::unique_ptr<grpc::ClientContext> NewContext() const;
  std::vector<int32_t> AllTokens() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool IsEos(int32_t token) const;

  RouterService& router_;
  // Responses go out serialized: Generate is a raw method (see RouterService).
  void Send(const tandem::v1::GenerateResponse& response);

  rpc::ServerStream<grpc::ByteBuffer> stream_;
  const std::chrono::system_clock::time_point deadline_;
  const Clock::time_point arrival_;

  absl::Mutex mu_;
  // Work that must not run under mu_ (it calls into gRPC or back into this object), queued by
  // code holding mu_ and run, in order, when Lock releases it.
  std::vector<std::function<void()>> deferred_ ABSL_GUARDED_BY(mu_);
  Phase phase_ ABSL_GUARDED_BY(mu_) = Phase::kWaiting;
  bool running_ ABSL_GUARDED_BY(mu_) = false;  // counted as running by the router
  std::string id_;
  std::vector<int32_t> prompt_;
  std::vector<uint64_t> hashes_;  // chained block hashes of the prompt
  tandem::v1::SamplingParams sampling_;
  std::optional<OutputAssembler> output_ ABSL_GUARDED_BY(mu_);
  std::vector<int32_t> generated_ ABSL_GUARDED_BY(mu_);
  int attempts_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<Worker*> failed_prefill_ ABSL_GUARDED_BY(mu_);
  std::vector<Worker*> failed_decode_ ABSL_GUARDED_BY(mu_);
  bool rescheduled_ ABSL_GUARDED_BY(mu_) = false;  // re-prefilled once after misses
  int64_t ahead_bytes_ ABSL_GUARDED_BY(mu_) = 0;    // counted by the router's pacing
  bool first_decode_message_ ABSL_GUARDED_BY(mu_) = true;
  // The worker call in flight, cancelled with the request.
  std::shared_ptr<grpc::ClientContext> call_ ABSL_GUARDED_BY(mu_);
  // Usage and timings.
  int cached_prompt_tokens_ ABSL_GUARDED_BY(mu_) = -1;
  double queue_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  double prefill_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  double transfer_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<Clock::time_point> first_token_at_ ABSL_GUARDED_BY(mu_);
  Clock::time_point last_token_at_ ABSL_GUARDED_BY(mu_);
};

// The server reactor of one Generate call.
class GenerateCall final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  GenerateCall(RouterService& router, grpc::CallbackServerContext* context,
               const grpc::ByteBuffer& request);
  void OnWriteDone(bool ok) override { state_->stream().WriteDone(ok); }
  void OnCancel() override { state_->Cancel(); }
  void OnDone() override { delete this; }

 private:
  std::shared_ptr<CallState> state_;
};

}  // namespace tandem::router
