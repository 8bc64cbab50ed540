#include "router/http/openai_door.h"

#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "router/http/completion_call.h"
#include "router/http/openai_format.h"
#include "router/request_validation.h"

namespace tandem::router {
namespace {

using json = OrderedJson;

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
  ResponseFormat format(Endpoint::kCompletions, parsed->model, created_, parsed->include_usage);
  auto call = std::make_shared<CompletionCall>(router_.environment(), std::move(responder),
                                               std::move(*parsed), std::move(format));
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
