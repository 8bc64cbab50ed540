#include "bench/serving/generate_call.h"

#include <string>

namespace tandem::bench {

void GenerateCall::Start(tandem::v1::Inference::Stub& stub, const BenchRequest& request,
                         std::chrono::duration<double> timeout, const RunClock& clock,
                         RequestRecord& record, std::function<void(bool ok)> on_done,
                         const std::string& authorization) {
  // Owned by gRPC until OnDone, which deletes it.
  auto* call = new GenerateCall(clock, record, std::move(on_done));
  if (request.prompt_token_ids.empty()) {
    call->request_.set_prompt(request.prompt);
  } else {
    call->request_.mutable_prompt_token_ids()->Assign(request.prompt_token_ids.begin(),
                                                      request.prompt_token_ids.end());
  }
  call->request_.mutable_sampling()->set_max_tokens(request.max_tokens);
  call->request_.mutable_sampling()->set_ignore_eos(true);
  if (!authorization.empty()) call->context_.AddMetadata("authorization", authorization);
  call->context_.set_deadline(
      std::chrono::system_clock::now() +
      std::chrono::duration_cast<std::chrono::system_clock::duration>(timeout));
  stub.async()->Generate(&call->context_, &call->request_, call);
  call->StartRead(&call->response_);
  record.send_s = clock.Now();
  call->StartCall();
}

void GenerateCall::OnChunk(const tandem::v1::Chunk& chunk) {
  const int n = chunk.token_ids_size();
  if (n == 0) return;
  const double now = clock_.Now();
  if (record_.first_token_s < 0) {
    record_.first_token_s = now;
  } else {
    const double share = (now - record_.last_token_s) / n;
    record_.itl_s.insert(record_.itl_s.end(), static_cast<size_t>(n), share);
  }
  record_.last_token_s = now;
  record_.streamed_tokens += n;
}

void GenerateCall::OnReadDone(bool ok) {
  if (!ok) return;  // the stream ended; OnDone follows with its status
  if (response_.has_chunk()) {
    OnChunk(response_.chunk());
  } else if (response_.has_complete()) {
    record_.got_complete = true;
    record_.prompt_tokens = response_.complete().usage().prompt_tokens();
    record_.completion_tokens = response_.complete().usage().completion_tokens();
  }
  StartRead(&response_);
}

void GenerateCall::OnDone(const grpc::Status& status) {
  record_.end_s = clock_.Now();
  if (!status.ok()) {
    record_.code = static_cast<absl::StatusCode>(status.error_code());
    record_.error = status.error_message();
  } else if (!record_.got_complete) {
    record_.code = absl::StatusCode::kInternal;
    record_.error = "the stream ended OK without a Complete message";
  } else {
    record_.code = absl::StatusCode::kOk;
  }
  std::function<void(bool)> on_done = std::move(on_done_);
  const bool ok = record_.ok();
  delete this;
  on_done(ok);
}

}  // namespace tandem::bench
