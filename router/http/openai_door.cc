#include "router/http/openai_door.h"

#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "common/rpc/status.h"
#include "common/util/utf8.h"
#include "common/util/log.h"
#include "router/generate_call.h"
#include "router/request_validation.h"

namespace tandem::router {
namespace {

using json = nlohmann::ordered_json;  // keys in the order OpenAI sends them
using tandem::v1::GenerateResponse;

std::string Dump(const json& v) {
  return v.dump(-1, ' ', false, json::error_handler_t::replace);
}

void ReplyJson(HttpResponder& responder, int status, const json& body, HttpHeaders headers = {}) {
  responder.Reply(status, "application/json", Dump(body), std::move(headers));
}

void ReplyError(HttpResponder& responder, const absl::Status& status) {
  const ApiError e = ToApiError(status);
  HttpHeaders headers;
  if (e.http_status == 429) headers.emplace_back("Retry-After", "1");
  responder.Reply(e.http_status, "application/json", e.body, std::move(headers));
}

std::string SseEvent(const json& v) { return absl::StrCat("data: ", Dump(v), "\n\n"); }

// One /v1/completions request: its choices (prompts x n), each a CallState of its own, gathered
// into one response or one SSE stream. Of a prompt's n choices the first starts alone; the rest
// start once it has its first token, so they find the prompt's KV blocks cached and prefill only
// what is left of its last block (one prefill for the n, as the issue asks).
//
// Threads: a choice's events arrive on gRPC threads under that CallState's lock (ResponseSink's
// contract); `mu_` is taken under it and so never held while calling into a CallState.
// Everything sent to the responder is sent under `mu_`, which keeps the stream in order.
class CompletionCall : public std::enable_shared_from_this<CompletionCall> {
 public:
  CompletionCall(const CallEnvironment& env, std::shared_ptr<HttpResponder> responder,
                 CompletionRequest request, int64_t created)
      : env_(env),
        want_logprobs_(request.prompts[0].sampling().logprobs()),
        responder_(std::move(responder)),
        request_(std::move(request)),
        id_(NewCompletionId()),
        created_(created),
        arrival_(Clock::now()) {
    // Chunk({{"index": ...}}) as text, split around the index and the text.
    json head = Chunk(json::array());
    head.erase("usage");
    std::string h = Dump(head);
    event_head_ = absl::StrCat("data: ", h.substr(0, h.size() - 2), "{\"index\":");  // "[]}"
    event_tail_ = absl::StrCat(",\"logprobs\":null,\"finish_reason\":null}]",
                               request_.include_usage ? ",\"usage\":null" : "", "}\n\n");
  }

  void Start();
  void OnEvent(int choice, const GenerateResponse& response,
               std::vector<std::function<void()>>& after_unlock);
  void OnEnd(int choice, const grpc::Status& status);
  void CancelAll();

 private:
  struct Choice {
    std::string text;
    json logprobs = {{"tokens", json::array()},  // OpenAI's completions logprobs object
                     {"token_logprobs", json::array()},
                     {"top_logprobs", json::array()},
                     {"text_offset", json::array()}};
    int64_t token_bytes = 0;  // of the token strings so far: the next text_offset
    std::string finish_reason;
    int prompt_tokens = 0;
    int completion_tokens = 0;
    int cached_tokens = 0;
  };

  int num_choices() const { return static_cast<int>(request_.prompts.size()) * request_.n; }
  // Starts choice `i`; false when it could not (the request has failed).
  bool StartChoice(int i) ABSL_LOCKS_EXCLUDED(mu_);
  // Starts choices 1..n-1 of prompt `p`, unless the request has already failed or been
  // cancelled.
  void StartSiblings(int p) ABSL_LOCKS_EXCLUDED(mu_);
  json Chunk(json choices) const;
  // The SSE event of one text delta: Chunk's JSON, written without building a JSON tree (this
  // runs once per token per stream).
  std::string TextEvent(int choice, const std::string& text) const;
  void Send(std::string event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Once every choice has started (or never will) and ended: the response, or the rest of the
  // stream. The calls hold this object through their sinks: `states_` is moved into `release`,
  // to be let go after unlocking.
  void MaybeFinish(std::vector<std::shared_ptr<CallState>>& release)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The first error ends the request: the other choices are cancelled (returned, to cancel
  // after unlocking).
  std::vector<std::shared_ptr<CallState>> Fail(absl::Status status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  json Usage() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The log-probabilities of one chunk's tokens, appended to `choice`'s; returns the chunk's
  // own, for its SSE event.
  json AddLogprobs(Choice& choice, const tandem::v1::Chunk& chunk) const;
  // How a token reads in logprobs: its text, or "bytes:\xNN..." when it is part of a character.
  std::string TokenText(int32_t id) const;

  const CallEnvironment& env_;
  const bool want_logprobs_;
  const std::shared_ptr<HttpResponder> responder_;
  const CompletionRequest request_;
  const std::string id_;
  const int64_t created_;
  const Clock::time_point arrival_;
  std::string event_head_;  // a text event up to the choice's index
  std::string event_tail_;  // and after its text

  absl::Mutex mu_;
  std::vector<std::shared_ptr<CallState>> states_ ABSL_GUARDED_BY(mu_);
  std::vector<Choice> choices_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> siblings_started_ ABSL_GUARDED_BY(mu_);  // per prompt
  int unstarted_ ABSL_GUARDED_BY(mu_) = 0;  // choices neither started nor given up
  bool admitted_ ABSL_GUARDED_BY(mu_) = false;   // each prompt's first choice has started
  bool streaming_ ABSL_GUARDED_BY(mu_) = false;  // the SSE head is out
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  int ended_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<absl::Status> error_ ABSL_GUARDED_BY(mu_);  // the first
  std::vector<std::string> pending_ ABSL_GUARDED_BY(mu_);   // events before the head
};

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

void CompletionCall::Start() {
  {
    absl::MutexLock lock(&mu_);
    choices_.resize(num_choices());
    siblings_started_.assign(request_.prompts.size(), request_.n == 1);
    unstarted_ = num_choices();
  }
  std::weak_ptr<CompletionCall> weak = weak_from_this();
  responder_->OnAbort([weak] {
    if (auto call = weak.lock()) call->CancelAll();
  });
  if (!request_.user.empty()) {
    Log(LogLevel::kInfo, "http", absl::StrCat(id_, ": user \"", request_.user, "\""));
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
  r.set_request_id(absl::StrCat(id_, "-", i));
  // Each choice of a prompt draws its own stream; choice 0 is what n = 1 would draw.
  const uint64_t seed = r.sampling().seed();
  if (seed != 0 && i % request_.n != 0) {
    const uint64_t s = seed + static_cast<uint64_t>(i % request_.n);
    r.mutable_sampling()->set_seed(s == 0 ? 1 : s);
  }
  const auto deadline = std::chrono::system_clock::time_point::max();  // the router's default
  absl::StatusOr<std::shared_ptr<CallState>> state =
      StartCall(env_, std::move(r), std::make_shared<ChoiceSink>(shared_from_this(), i), deadline,
                arrival_, Door::kHttp);
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
json CompletionCall::Chunk(json choices) const {
  json chunk = {{"id", id_},
                {"object", "text_completion"},
                {"created", created_},
                {"model", request_.model},
                {"choices", std::move(choices)}};
  if (request_.include_usage) chunk["usage"] = nullptr;
  return chunk;
}

std::string CompletionCall::TextEvent(int choice, const std::string& text) const {
  return absl::StrCat(event_head_, choice, ",\"text\":",
                      json(text).dump(-1, ' ', false, json::error_handler_t::replace),
                      event_tail_);
}

std::string CompletionCall::TokenText(int32_t id) const {
  if (env_.tokenizer == nullptr) return absl::StrCat("token_id:", id);
  absl::StatusOr<std::string> bytes = env_.tokenizer->DecodeBytes({id}, false);
  if (!bytes.ok()) return absl::StrCat("token_id:", id);
  if (ValidateUtf8(*bytes).ok()) return *std::move(bytes);
  std::string out = "bytes:";
  for (unsigned char b : *bytes) absl::StrAppend(&out, absl::StrFormat("\\x%02x", b));
  return out;
}

json CompletionCall::AddLogprobs(Choice& choice, const tandem::v1::Chunk& chunk) const {
  json own = {{"tokens", json::array()},
              {"token_logprobs", json::array()},
              {"top_logprobs", json::array()},
              {"text_offset", json::array()}};
  for (int i = 0; i < chunk.token_ids_size() && i < chunk.logprobs_size(); ++i) {
    const tandem::v1::TokenLogprobs& lp = chunk.logprobs(i);
    const std::string text = TokenText(chunk.token_ids(i));
    json top = json::object();
    for (int j = 0; j < lp.top_token_ids_size() && j < lp.top_logprobs_size(); ++j) {
      top[TokenText(lp.top_token_ids(j))] = lp.top_logprobs(j);
    }
    own["tokens"].push_back(text);
    own["token_logprobs"].push_back(lp.logprob());
    own["top_logprobs"].push_back(std::move(top));
    own["text_offset"].push_back(choice.token_bytes);
    choice.token_bytes += static_cast<int64_t>(text.size());
  }
  for (const char* key : {"tokens", "token_logprobs", "top_logprobs", "text_offset"}) {
    for (const json& v : own[key]) choice.logprobs[key].push_back(v);
  }
  return own;
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
    const std::string& text = response.chunk().text();
    c.text += text;
    if (want_logprobs_) {
      json lp = AddLogprobs(c, response.chunk());
      if (request_.stream) {
        Send(SseEvent(Chunk(json::array({{{"index", choice},
                                          {"text", text},
                                          {"logprobs", std::move(lp)},
                                          {"finish_reason", nullptr}}}))));
      }
      return;
    }
    if (text.empty()) return;
    if (request_.stream) Send(TextEvent(choice, text));
  } else if (response.has_complete()) {
    const tandem::v1::Complete& done = response.complete();
    c.finish_reason = FinishReasonName(done.finish_reason());
    c.prompt_tokens = done.usage().prompt_tokens();
    c.completion_tokens = done.usage().completion_tokens();
    c.cached_tokens = done.usage().cached_prompt_tokens();
    if (request_.stream) {
      Send(SseEvent(Chunk(json::array({{{"index", choice},
                                        {"text", ""},
                                        {"logprobs", nullptr},
                                        {"finish_reason", c.finish_reason}}}))));
    }
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
      json usage = Chunk(json::array());
      usage["usage"] = Usage();
      responder_->Write(SseEvent(usage));
    }
    responder_->Write("data: [DONE]\n\n");
    responder_->EndStream();
  } else {
    json choices = json::array();
    for (int i = 0; i < num_choices(); ++i) {
      choices.push_back({{"index", i},
                         {"text", choices_[i].text},
                         {"logprobs", want_logprobs_ ? choices_[i].logprobs : json(nullptr)},
                         {"finish_reason", choices_[i].finish_reason}});
    }
    json body = Chunk(std::move(choices));
    body["usage"] = Usage();
    ReplyJson(*responder_, 200, body);
  }
}

}  // namespace

OpenAiDoor::OpenAiDoor(RouterService& router, OpenAiLimits limits)
    : router_(router),
      limits_(std::move(limits)),
      created_(std::chrono::duration_cast<std::chrono::seconds>(
                   std::chrono::system_clock::now().time_since_epoch())
                   .count()) {}

void OpenAiDoor::Handle(HttpRequest request, std::shared_ptr<HttpResponder> responder) {
  const std::string path = request.target.substr(0, request.target.find('?'));
  struct Route {
    std::string_view path;
    std::string_view method;
  };
  static constexpr Route kRoutes[] = {{"/v1/completions", "POST"}, {"/v1/models", "GET"},
                                      {"/health", "GET"},          {"/tokenize", "POST"},
                                      {"/detokenize", "POST"}};
  for (const Route& route : kRoutes) {
    if (path != route.path) continue;
    if (request.method != route.method) {
      responder->Reply(405, "application/json",
                       ToApiError(absl::InvalidArgumentError(absl::StrCat(
                                      request.method, " is not allowed on ", path, "; use ",
                                      std::string(route.method))))
                           .body,
                       {{"Allow", std::string(route.method)}});
      return;
    }
    if (path == "/v1/completions") {
      Completions(request, std::move(responder));
    } else if (path == "/v1/models") {
      Models(*responder);
    } else if (path == "/health") {
      Health(*responder);
    } else if (path == "/tokenize") {
      Tokenize(request, *responder);
    } else {
      Detokenize(request, *responder);
    }
    return;
  }
  const ApiError e = ToApiError(absl::NotFoundError(absl::StrCat("no route for ", request.method,
                                                                 " ", path)));
  responder->Reply(404, "application/json", e.body);
}

std::pair<std::string, std::string> OpenAiDoor::RefusalBody(int status,
                                                           const std::string& message) {
  const absl::StatusCode code = status == 408 ? absl::StatusCode::kDeadlineExceeded
                                              : absl::StatusCode::kInvalidArgument;
  ApiError e = ToApiError(absl::Status(code, message));
  return {"application/json", std::move(e.body)};
}

void OpenAiDoor::Completions(const HttpRequest& request,
                             std::shared_ptr<HttpResponder> responder) {
  absl::StatusOr<CompletionRequest> parsed = ParseCompletionRequest(request.body, limits_);
  if (!parsed.ok()) {
    ReplyError(*responder, parsed.status());
    return;
  }
  auto call = std::make_shared<CompletionCall>(router_.environment(), std::move(responder),
                                               std::move(*parsed), created_);
  call->Start();
}

void OpenAiDoor::Models(HttpResponder& responder) {
  ReplyJson(responder, 200,
            {{"object", "list"},
             {"data", json::array({{{"id", limits_.model_name},
                                    {"object", "model"},
                                    {"created", created_},
                                    {"owned_by", "tandem"},
                                    {"root", limits_.model_name},
                                    {"max_model_len", limits_.context_length}}})}});
}

void OpenAiDoor::Health(HttpResponder& responder) {
  const CallEnvironment& env = router_.environment();
  std::string why;
  if (env.shutting_down) {
    why = "shutting down";
  } else if (env.decode_pool.available() == 0) {
    why = "no decode worker is available";
  } else if (!env.options.colocated && env.prefill_pool.available() == 0) {
    why = "no prefill worker is available";
  }
  if (why.empty()) {
    ReplyJson(responder, 200, {{"status", "ok"}});
  } else {
    ReplyJson(responder, 503, {{"status", "unavailable"}, {"reason", why}});
  }
}

void OpenAiDoor::Tokenize(const HttpRequest& request, HttpResponder& responder) {
  const tokenizer::Tokenizer* tok = router_.tokenizer();
  absl::StatusOr<TokenizeRequest> parsed = ParseTokenizeRequest(request.body, limits_);
  if (!parsed.ok()) {
    ReplyError(responder, parsed.status());
    return;
  }
  if (tok == nullptr) {
    ReplyError(responder, InvalidField("prompt", "this model has no tokenizer.json"));
    return;
  }
  absl::StatusOr<std::vector<int32_t>> ids = tok->Encode(parsed->prompt, parsed->add_special_tokens);
  if (!ids.ok()) {
    ReplyError(responder, InvalidField("prompt", std::string(ids.status().message())));
    return;
  }
  ReplyJson(responder, 200,
            {{"count", ids->size()}, {"max_model_len", limits_.context_length}, {"tokens", *ids}});
}

void OpenAiDoor::Detokenize(const HttpRequest& request, HttpResponder& responder) {
  const tokenizer::Tokenizer* tok = router_.tokenizer();
  absl::StatusOr<std::vector<int32_t>> ids = ParseDetokenizeRequest(request.body, limits_);
  if (!ids.ok()) {
    ReplyError(responder, ids.status());
    return;
  }
  if (tok == nullptr) {
    ReplyError(responder, InvalidField("tokens", "this model has no tokenizer.json"));
    return;
  }
  absl::StatusOr<std::string> text = tok->Decode(*ids, /*skip_special_tokens=*/false);
  if (!text.ok()) {
    ReplyError(responder, InvalidField("tokens", std::string(text.status().message())));
    return;
  }
  ReplyJson(responder, 200, {{"prompt", *text}});
}

}  // namespace tandem::router
