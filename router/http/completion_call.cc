#include "router/http/completion_call.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/rpc/status.h"
#include "common/util/log.h"

namespace tandem::router {
namespace {

using json = OrderedJson;
using tandem::v1::GenerateResponse;

class ChoiceSink final : public ResponseSink {
 public:
  ChoiceSink(std::shared_ptr<CompletionCall> call, int choice)
      : call_(std::move(call)), choice_(choice) {}
  void Push(const GenerateResponse& response,
            std::vector<std::function<void()>>& after_unlock) override {
    call_->OnEvent(choice_, response, after_unlock);
  }
  void End(const grpc::Status& status) override { call_->OnEnd(choice_, status); }

 private:
  const std::shared_ptr<CompletionCall> call_;
  const int choice_;
};

}  // namespace

CompletionCall::CompletionCall(const CallEnvironment& env, std::shared_ptr<HttpResponder> responder,
                               CompletionRequest request, ResponseFormat format)
    : env_(env),
      responder_(std::move(responder)),
      request_(std::move(request)),
      format_(std::move(format)),
      want_logprobs_(request_.prompts[0].sampling().logprobs()),
      arrival_(Clock::now()) {}

void CompletionCall::Start() {
  {
    absl::MutexLock lock(&mu_);
    choices_.resize(num_choices());
    for (Choice& c : choices_) {
      c.result.logprobs = want_logprobs_ ? format_.EmptyLogprobs() : OrderedJson(nullptr);
    }
    siblings_started_.assign(request_.prompts.size(), request_.n == 1);
    unstarted_ = num_choices();
  }
  std::weak_ptr<CompletionCall> weak = weak_from_this();
  responder_->OnAbort([weak] {
    if (auto call = weak.lock()) call->CancelAll();
  });
  if (!request_.user.empty()) {
    Log(LogLevel::kInfo, "http", absl::StrCat(format_.id(), ": user \"", request_.user, "\""));
  }
  const int prompts = static_cast<int>(request_.prompts.size());
  int p = 0;  // the first prompt whose first choice did not start, if any
  while (p < prompts && StartChoice(p * request_.n)) ++p;
  std::vector<std::shared_ptr<CallState>> cancel, release;
  {
    absl::MutexLock lock(&mu_);
    admitted_ = true;
    if (p < prompts) {  // its siblings and the prompts after it never start
      unstarted_ -= request_.n - 1 + (prompts - p - 1) * request_.n;
      for (int q = p; q < prompts; ++q) siblings_started_[q] = true;
    }
    if (error_.has_value() || cancelled_) {
      cancel = states_;
    } else if (request_.stream) {
      streaming_ = true;
      responder_->StartStream(200, "text/event-stream");
      if (format_.endpoint() == Endpoint::kChat) {
        for (int i = 0; i < num_choices(); ++i) responder_->Write(format_.RoleEvent(i));
      }
      for (auto& e : pending_) responder_->Write(std::move(e));
      pending_.clear();
    }
    MaybeFinish(release);
  }
  for (auto& s : cancel) s->Cancel();
}

bool CompletionCall::StartChoice(int i) {
  {
    absl::MutexLock lock(&mu_);
    if (error_.has_value() || cancelled_) {
      --unstarted_;
      return false;
    }
  }
  tandem::v1::GenerateRequest r = request_.prompts[i / request_.n];
  r.set_request_id(absl::StrCat(format_.id(), "-", i));
  r.set_cache_salt(request_.cache_salt);
  // Each choice of a prompt draws its own stream; choice 0 is what n = 1 would draw.
  if (r.sampling().seeded() && i % request_.n != 0) {
    r.mutable_sampling()->set_seed(r.sampling().seed() + static_cast<uint64_t>(i % request_.n));
  }
  const auto deadline = std::chrono::system_clock::time_point::max();  // the router's default
  absl::StatusOr<std::shared_ptr<CallState>> state =
      StartCall(env_, std::move(r), std::make_shared<ChoiceSink>(shared_from_this(), i), deadline,
                arrival_, Door::kHttp, request_.lease);
  std::vector<std::shared_ptr<CallState>> cancel, release;
  bool ok = state.ok();
  {
    absl::MutexLock lock(&mu_);
    --unstarted_;
    if (ok) {
      states_.push_back(*state);
      if (cancelled_) cancel.push_back(*state);
    } else {
      cancel = Fail(state.status());
    }
    MaybeFinish(release);
  }
  for (auto& s : cancel) s->Cancel();
  return ok && cancel.empty();
}

void CompletionCall::StartSiblings(int p) {
  for (int j = 1; j < request_.n; ++j) {
    if (!StartChoice(p * request_.n + j)) {
      // The rest never start.
      std::vector<std::shared_ptr<CallState>> release;
      absl::MutexLock lock(&mu_);
      unstarted_ -= request_.n - 1 - j;
      MaybeFinish(release);
      return;
    }
  }
}

std::vector<std::shared_ptr<CallState>> CompletionCall::Fail(absl::Status status) {
  if (error_.has_value() || cancelled_) return {};
  error_ = std::move(status);
  cancelled_ = true;
  return states_;
}
void CompletionCall::Send(std::string event) {
  if (streaming_) {
    responder_->Write(std::move(event));
  } else if (!admitted_) {
    pending_.push_back(std::move(event));
  }
}

void CompletionCall::OnEvent(int choice, const GenerateResponse& response,
                             std::vector<std::function<void()>>& after_unlock) {
  absl::MutexLock lock(&mu_);
  Choice& c = choices_[choice];
  const int prompt = choice / request_.n;
  if (!siblings_started_[prompt]) {
    // The first choice has its first token: the prompt's blocks are cached for the others.
    siblings_started_[prompt] = true;
    after_unlock.push_back([self = shared_from_this(), prompt] { self->StartSiblings(prompt); });
  }
  if (response.has_chunk()) {
    AddChunk(choice, response.chunk());
  } else if (response.has_complete()) {
    const tandem::v1::Complete& done = response.complete();
    // The prompt goes out even when no chunk came (a stop string held the first tokens back).
    if (request_.echo && !c.echoed) AddChunk(choice, tandem::v1::Chunk());
    // A request ends by a stop or its length (an abort ends it with an error instead).
    c.result.finish_reason = done.finish_reason() == tandem::v1::FINISH_REASON_LENGTH ||
                                     request_.generate_none
                                 ? "length"
                                 : "stop";
    c.prompt_tokens = done.usage().prompt_tokens();
    c.completion_tokens = request_.generate_none ? 0 : done.usage().completion_tokens();
    c.cached_tokens = done.usage().cached_prompt_tokens();
    if (request_.stream) Send(format_.FinishEvent(choice, c.result.finish_reason));
  }
}

void CompletionCall::AddChunk(int choice, const tandem::v1::Chunk& chunk) {
  Choice& c = choices_[choice];
  std::string text;
  json lp = want_logprobs_ ? format_.EmptyLogprobs() : json(nullptr);
  const bool echoes = request_.echo && !c.echoed;
  if (!echoes && request_.generate_none) return;
  if (echoes) {
    c.echoed = true;
    text = request_.prompt_texts[choice / request_.n];
    if (want_logprobs_) lp = format_.PromptLogprobs(chunk, env_.tokenizer, c.text_offset);
  }
  if (!request_.generate_none) {
    text += chunk.text();
    if (want_logprobs_) {
      format_.AppendLogprobs(lp, format_.ChunkLogprobs(chunk, env_.tokenizer, c.text_offset));
    }
  }
  c.result.text += text;
  if (want_logprobs_) {
    format_.AppendLogprobs(c.result.logprobs, lp);
    if (request_.stream) Send(format_.TextEvent(choice, text, std::move(lp)));
  } else if (!text.empty() && request_.stream) {
    Send(format_.TextEvent(choice, text));
  }
}

void CompletionCall::OnEnd(int choice, const grpc::Status& status) {
  std::vector<std::shared_ptr<CallState>> cancel, release;
  bool start_siblings = false;
  const int prompt = choice / request_.n;
  {
    absl::MutexLock lock(&mu_);
    ++ended_;
    // One choice failed: the request has, so the others stop too.
    if (!status.ok() && !cancelled_) cancel = Fail(rpc::FromGrpcStatus(status));
    if (!siblings_started_[prompt]) {  // it ended before its first token: they never will
      siblings_started_[prompt] = true;
      start_siblings = true;
    }
    MaybeFinish(release);
  }
  for (auto& s : cancel) s->Cancel();
  if (start_siblings) StartSiblings(prompt);
}

void CompletionCall::CancelAll() {
  std::vector<std::shared_ptr<CallState>> cancel;
  {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    cancel = states_;
  }
  for (auto& s : cancel) s->Cancel();
}

json CompletionCall::Usage() const {
  int prompt = 0, completion = 0, cached = 0;
  for (int i = 0; i < num_choices(); ++i) {
    if (i % request_.n == 0) {  // a prompt counts once, however many choices it has
      prompt += choices_[i].prompt_tokens;
      cached += choices_[i].cached_tokens;
    }
    completion += choices_[i].completion_tokens;
  }
  return {{"prompt_tokens", prompt},
          {"completion_tokens", completion},
          {"total_tokens", prompt + completion},
          {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

void CompletionCall::MaybeFinish(std::vector<std::shared_ptr<CallState>>& release) {
  if (finished_ || !admitted_ || unstarted_ > 0 || ended_ < static_cast<int>(states_.size())) {
    return;
  }
  finished_ = true;
  release = std::move(states_);
  states_.clear();
  if (error_.has_value() && !streaming_) {
    ReplyError(*responder_, *error_);
  } else if (streaming_) {
    if (error_.has_value()) {
      responder_->Write(absl::StrCat("data: ", ToApiError(*error_).body, "\n\n"));
    } else if (request_.include_usage) {
      responder_->Write(format_.UsageEvent(Usage()));
    }
    responder_->Write("data: [DONE]\n\n");
    responder_->EndStream();
  } else {
    std::vector<ChoiceResult> results;
    for (Choice& c : choices_) results.push_back(std::move(c.result));
    json body = format_.Body(results, Usage());
    ReplyJson(*responder_, 200, body);
  }
}


}  // namespace tandem::router
