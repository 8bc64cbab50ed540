// The router's OpenAI-compatible HTTP front door: the routes of the OpenAI API that Tandem
// serves, each translated to the request path the gRPC API runs (StartCall), so a request
// behaves the same whichever door it came in by.
//
//   POST /v1/completions   text or token-id prompts, n choices, SSE streaming
//   POST /v1/chat/completions  messages rendered with the model's own chat template
//   GET  /v1/models        the served model and its context length
//   GET  /health           200 while a prefill and a decode worker are usable, else 503
//   POST /tokenize, /detokenize
//
// Thread-safe: Handle runs on the HTTP server's I/O threads.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "common/chat/chat_template.h"
#include "router/http/http_server.h"
#include "router/http/openai_protocol.h"
#include "router/router_service.h"

namespace tandem::router {

class OpenAiDoor {
 public:
  // `router` must outlive the door and every request it started. `chat` is the model's chat
  // template, or why there is none (chat requests are refused with it).
  OpenAiDoor(RouterService& router, OpenAiLimits limits,
             absl::StatusOr<chat::ChatTemplateConfig> chat =
                 absl::NotFoundError("no chat template was loaded"));

  void Handle(HttpRequest request, std::shared_ptr<HttpResponder> responder);
  // The server's own refusals (413, 431, ...) as OpenAI error bodies.
  static std::pair<std::string, std::string> RefusalBody(int status, const std::string& message);

 private:
  // `lease`: the request's API key quota (null without keys).
  void Completions(const HttpRequest& request, std::shared_ptr<HttpResponder> responder,
                   std::shared_ptr<security::KeyLease> lease);
  void ChatCompletions(const HttpRequest& request, std::shared_ptr<HttpResponder> responder,
                       std::shared_ptr<security::KeyLease> lease);
  // The prompt of a conversation: its messages through the template, tokenized (with the
  // tokenizer's special tokens only when asked: the template places them).
  absl::StatusOr<std::vector<int32_t>> ChatPrompt(const Conversation& request,
                                                  bool add_special_tokens = false) const;
  void Models(HttpResponder& responder);
  void Health(HttpResponder& responder);
  void Tokenize(const HttpRequest& request, HttpResponder& responder);
  void Detokenize(const HttpRequest& request, HttpResponder& responder);

  RouterService& router_;
  const OpenAiLimits limits_;
  const absl::StatusOr<chat::ChatTemplateConfig> chat_;
  const int64_t created_;  // the models' "created" time: when the door opened
};

}  // namespace tandem::router
