#include "tests/unit/bench/fake_inference.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"

namespace tandem::bench::testing {

using tandem::v1::GenerateRequest;
using tandem::v1::GenerateResponse;

// One Generate stream: a state machine that keeps at most one write outstanding. Reactor calls
// happen outside `mu_`; `writing_`, `held_` and `finished_` make each happen at the right time
// and once. A held stream is finished only after whoever takes it off the held list (Release,
// or OnCancel when it finds it still listed) clears `held_`, so the service never touches a
// deleted stream.
class FakeStream final : public grpc::ServerWriteReactor<GenerateResponse> {
 public:
  FakeStream(FakeInference& service, const GenerateRequest& request)
      : service_(service),
        remaining_(request.sampling().max_tokens()),
        max_tokens_(request.sampling().max_tokens()),
        prompt_tokens_(request.prompt_token_ids_size() > 0
                           ? request.prompt_token_ids_size()
                           : static_cast<int>(request.prompt().size())) {
    // `held_` starts true, so a stream listed by Arrive stays put until taken off the list.
    bool fail = false;
    const bool listed = service_.Arrive(this, request, &fail);
    if (fail) {
      {
        absl::MutexLock lock(&mu_);
        finished_ = true;
      }
      Finish(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "fake queue is full"));
      return;
    }
    if (!listed) Release();
  }

  void Release() {
    {
      absl::MutexLock lock(&mu_);
      held_ = false;
    }
    Advance();
  }

  void OnWriteDone(bool ok) override {
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok) cancelled_ = true;
    }
    Advance();
  }

  void OnCancel() override {
    const bool was_listed = service_.Unlist(this);
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      if (was_listed) held_ = false;
    }
    Advance();
  }

  void OnDone() override { delete this; }

 private:
  void Advance() {
    bool write = false;
    std::optional<grpc::Status> finish;
    {
      absl::MutexLock lock(&mu_);
      if (finished_ || writing_ || held_) return;
      if (cancelled_) {
        finish = grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
      } else if (remaining_ > 0) {
        write = true;
        NextChunk();
      } else if (!complete_sent_) {
        write = true;
        complete_sent_ = true;
        message_.Clear();
        auto* usage = message_.mutable_complete()->mutable_usage();
        usage->set_prompt_tokens(prompt_tokens_);
        usage->set_completion_tokens(max_tokens_);
        message_.mutable_complete()->set_finish_reason(tandem::v1::FINISH_REASON_LENGTH);
      } else {
        finish = grpc::Status::OK;
      }
      writing_ = write;
      finished_ = finish.has_value();
    }
    if (write) StartWrite(&message_);
    if (finish.has_value()) {
      service_.Leave();  // before Finish: the client cannot see the end before this
      Finish(*finish);
    }
  }

  void NextChunk() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    message_.Clear();
    const int n = std::min(remaining_, service_.options_.chunk_tokens);
    for (int i = 0; i < n; ++i) {
      message_.mutable_chunk()->add_token_ids((max_tokens_ - remaining_ + i) % 100);
    }
    message_.mutable_chunk()->set_text(std::string(static_cast<size_t>(n), 'x'));
    remaining_ -= n;
  }

  FakeInference& service_;
  absl::Mutex mu_;
  int remaining_ ABSL_GUARDED_BY(mu_);
  const int max_tokens_;
  const int prompt_tokens_;
  bool held_ ABSL_GUARDED_BY(mu_) = true;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool complete_sent_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  GenerateResponse message_;  // written while `writing_`, rebuilt only when not
};

grpc::ServerWriteReactor<GenerateResponse>* FakeInference::Generate(
    grpc::CallbackServerContext* context, const GenerateRequest* request) {
  return new FakeStream(*this, *request);
}

grpc::ServerUnaryReactor* FakeInference::GetModelInfo(
    grpc::CallbackServerContext* context, const tandem::v1::GetModelInfoRequest* request,
    tandem::v1::ModelInfo* response) {
  response->set_name(options_.model_name);
  response->set_architecture("LlamaForCausalLM");
  response->set_vocab_size(options_.vocab_size);
  response->set_context_length(options_.context_length);
  response->set_kv_dtype("fp32");
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

bool FakeInference::Arrive(FakeStream* stream, const GenerateRequest& request, bool* fail) {
  std::vector<FakeStream*> release;
  {
    absl::MutexLock lock(&mu_);
    ++calls_;
    requests_.push_back(request);
    if (options_.fail_every > 0 && calls_ % options_.fail_every == 0) {
      *fail = true;
      return false;
    }
    ++active_;
    peak_active_ = std::max(peak_active_, active_);
    if (options_.release_at_active <= 0) return false;
    const bool open = active_ >= options_.release_at_active ||
                      (options_.release_at_calls > 0 && calls_ >= options_.release_at_calls);
    if (!open) {
      held_.push_back(stream);
      return true;
    }
    release.swap(held_);
  }
  for (FakeStream* s : release) s->Release();
  return false;
}

bool FakeInference::Unlist(FakeStream* stream) {
  absl::MutexLock lock(&mu_);
  auto it = std::find(held_.begin(), held_.end(), stream);
  if (it == held_.end()) return false;
  held_.erase(it);
  return true;
}

void FakeInference::Leave() {
  absl::MutexLock lock(&mu_);
  --active_;
}

int64_t FakeInference::calls() const {
  absl::MutexLock lock(&mu_);
  return calls_;
}

int64_t FakeInference::peak_active() const {
  absl::MutexLock lock(&mu_);
  return peak_active_;
}

std::vector<GenerateRequest> FakeInference::requests() const {
  absl::MutexLock lock(&mu_);
  return requests_;
}

}  // namespace tandem::bench::testing
