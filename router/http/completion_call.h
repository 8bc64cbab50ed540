// One OpenAI completion request (/v1/completions or /v1/chat/completions): its choices
// (prompts x n), each a CallState of its own, gathered into one response or one SSE stream in
// the endpoint's shape (ResponseFormat).
//
// Of a prompt's n choices the first starts alone; the rest start once it has its first token,
// so they find the prompt's KV blocks cached and prefill only what is left of its last block
// (one prefill for the n).
//
// Threads: a choice's events arrive on gRPC threads under that CallState's lock (ResponseSink's
// contract); `mu_` is taken under it and so never held while calling into a CallState.
// Everything sent to the responder is sent under `mu_`, which keeps the stream in order.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "router/call_environment.h"
#include "router/generate_call.h"
#include "router/http/http_server.h"
#include "router/http/openai_format.h"
#include "router/http/openai_protocol.h"

namespace tandem::router {

class CompletionCall : public std::enable_shared_from_this<CompletionCall> {
 public:
  CompletionCall(const CallEnvironment& env, std::shared_ptr<HttpResponder> responder,
                 CompletionRequest request, ResponseFormat format);

  // Starts the choices; the response follows once they end (or at once, on an error).
  void Start();

  // From the choices' sinks.
  void OnEvent(int choice, const tandem::v1::GenerateResponse& response,
               std::vector<std::function<void()>>& after_unlock);
  void OnEnd(int choice, const grpc::Status& status);
  // The client went away.
  void CancelAll();

 private:
  struct Choice {
    ChoiceResult result;
    int64_t text_offset = 0;  // completions logprobs: bytes of the token strings so far
    int prompt_tokens = 0;
    int completion_tokens = 0;
    int cached_tokens = 0;
    bool echoed = false;  // with echo: the prompt's text (and log-probabilities) went out
  };

  int num_choices() const { return static_cast<int>(request_.prompts.size()) * request_.n; }
  // Starts choice `i`; false when it could not (the request has failed).
  bool StartChoice(int i) ABSL_LOCKS_EXCLUDED(mu_);
  // Starts choices 1..n-1 of prompt `p`, unless the request has already failed or been
  // cancelled.
  void StartSiblings(int p) ABSL_LOCKS_EXCLUDED(mu_);
  void Send(std::string event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A chunk of choice `choice` (the first with echo carries the prompt) into its result and,
  // streaming, an event.
  void AddChunk(int choice, const tandem::v1::Chunk& chunk) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Once every choice has started (or never will) and ended: the response, or the rest of the
  // stream. The calls hold this object through their sinks: `states_` is moved into `release`,
  // to be let go after unlocking.
  void MaybeFinish(std::vector<std::shared_ptr<CallState>>& release)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The first error ends the request: the other choices are cancelled (returned, to cancel
  // after unlocking).
  std::vector<std::shared_ptr<CallState>> Fail(absl::Status status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  OrderedJson Usage() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const CallEnvironment& env_;
  const std::shared_ptr<HttpResponder> responder_;
  const CompletionRequest request_;
  const ResponseFormat format_;
  const bool want_logprobs_;
  const Clock::time_point arrival_;

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

}  // namespace tandem::router
