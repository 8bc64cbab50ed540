#include "router/http/openai_door.h"

#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include <limits>
#include "router/http/completion_call.h"
#include "router/http/openai_format.h"
#include "router/request_validation.h"

namespace tandem::router {
namespace {

using json = OrderedJson;

}  // namespace

OpenAiDoor::OpenAiDoor(RouterService& router, OpenAiLimits limits,
                       absl::StatusOr<chat::ChatTemplateConfig> chat)
    : router_(router),
      limits_(std::move(limits)),
      chat_(std::move(chat)),
      created_(std::chrono::duration_cast<std::chrono::seconds>(
                   std::chrono::system_clock::now().time_since_epoch())
                   .count()) {}

void OpenAiDoor::Handle(HttpRequest request, std::shared_ptr<HttpResponder> responder) {
  const std::string path = request.target.substr(0, request.target.find('?'));
  struct Route {
    std::string_view path;
    std::string_view method;
  };
  static constexpr Route kRoutes[] = {{"/v1/completions", "POST"},
                                      {"/v1/chat/completions", "POST"},
                                      {"/v1/models", "GET"},
                                      {"/health", "GET"},
                                      {"/tokenize", "POST"},
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
    // API keys: every route but /health (for load balancers, unless health_needs_key). A
    // generation holds its key's quota until it ends.
    std::shared_ptr<security::KeyLease> lease;
    if (security::ApiKeys* keys = router_.options().api_keys;
        keys != nullptr && (path != "/health" || limits_.health_needs_key)) {
      const bool generates = path == "/v1/completions" || path == "/v1/chat/completions";
      absl::Status allowed;
      if (generates) {
        auto admitted = keys->Admit(request.Header("authorization"), std::string(path));
        allowed = admitted.status();
        if (admitted.ok()) lease = *std::move(admitted);
      } else {
        allowed = keys->Authenticate(request.Header("authorization"), std::string(path)).status();
      }
      if (!allowed.ok()) {
        ReplyError(*responder, allowed);
        return;
      }
    }
    if (path == "/v1/completions") {
      Completions(request, std::move(responder), std::move(lease));
    } else if (path == "/v1/chat/completions") {
      ChatCompletions(request, std::move(responder), std::move(lease));
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

void OpenAiDoor::Completions(const HttpRequest& request, std::shared_ptr<HttpResponder> responder,
                             std::shared_ptr<security::KeyLease> lease) {
  absl::StatusOr<CompletionRequest> parsed = ParseCompletionRequest(request.body, limits_);
  if (!parsed.ok()) {
    ReplyError(*responder, parsed.status());
    return;
  }
  if (parsed->echo) {
    // A token-id prompt echoes as its text.
    const tokenizer::Tokenizer* tok = router_.tokenizer();
    for (size_t i = 0; i < parsed->prompts.size(); ++i) {
      const tandem::v1::GenerateRequest& r = parsed->prompts[i];
      if (r.prompt_token_ids_size() == 0 || tok == nullptr) continue;
      absl::StatusOr<std::string> text = tok->Decode(
          std::vector<int32_t>(r.prompt_token_ids().begin(), r.prompt_token_ids().end()),
          /*skip_special_tokens=*/false);
      if (!text.ok()) {
        ReplyError(*responder, InvalidField("prompt", std::string(text.status().message())));
        return;
      }
      parsed->prompt_texts[i] = *std::move(text);
    }
  }
  parsed->lease = std::move(lease);
  ResponseFormat format(Endpoint::kCompletions, parsed->model, created_, parsed->include_usage);
  auto call = std::make_shared<CompletionCall>(router_.environment(), std::move(responder),
                                               std::move(*parsed), std::move(format));
  call->Start();
}

void OpenAiDoor::ChatCompletions(const HttpRequest& request,
                                 std::shared_ptr<HttpResponder> responder,
                                 std::shared_ptr<security::KeyLease> lease) {
  absl::StatusOr<ChatRequest> parsed = ParseChatRequest(request.body, limits_);
  absl::StatusOr<std::vector<int32_t>> prompt =
      parsed.ok() ? ChatPrompt(*parsed) : absl::StatusOr<std::vector<int32_t>>(parsed.status());
  if (!prompt.ok()) {
    ReplyError(*responder, prompt.status());
    return;
  }
  // No max_tokens: what the context has room for after the prompt.
  const int64_t room = limits_.context_length - static_cast<int64_t>(prompt->size());
  const int64_t max_tokens = parsed->max_tokens > 0 ? parsed->max_tokens : room;
  if (max_tokens <= 0) {
    ReplyError(*responder, InvalidField("messages", absl::StrCat("the prompt has ", prompt->size(),
                                                                 " tokens; the context length is ",
                                                                 limits_.context_length)));
    return;
  }
  tandem::v1::GenerateRequest generate;
  generate.mutable_prompt_token_ids()->Add(prompt->begin(), prompt->end());
  *generate.mutable_sampling() = parsed->sampling;
  generate.mutable_sampling()->set_max_tokens(
      static_cast<int32_t>(std::min<int64_t>(max_tokens, std::numeric_limits<int32_t>::max())));
  CompletionRequest completion = std::move(parsed->completion);
  completion.prompts = {std::move(generate)};
  completion.lease = std::move(lease);
  ResponseFormat format(Endpoint::kChat, completion.model, created_, completion.include_usage);
  auto call = std::make_shared<CompletionCall>(router_.environment(), std::move(responder),
                                               std::move(completion), std::move(format));
  call->Start();
}

absl::StatusOr<std::vector<int32_t>> OpenAiDoor::ChatPrompt(const Conversation& request,
                                                            bool add_special_tokens) const {
  if (!chat_.ok()) {
    return InvalidField("messages", absl::StrCat("this model serves no chat template: ",
                                                 chat_.status().message()));
  }
  const tokenizer::Tokenizer* tok = router_.tokenizer();
  if (tok == nullptr) return InvalidField("messages", "this model has no tokenizer.json");
  // The request's template arguments first, so they cannot replace the conversation.
  json context = request.template_kwargs;
  context["messages"] = request.messages;
  context["add_generation_prompt"] = request.add_generation_prompt;
  context["bos_token"] = chat_->bos_token;
  context["eos_token"] = chat_->eos_token;
  absl::StatusOr<std::string> text = chat_->tmpl->Render(context);
  if (!text.ok()) {
    return WithField(absl::Status(text.status().code(),
                                  absl::StrCat("chat template: ", text.status().message())),
                     "messages");
  }
  if (request.continue_final_message) {
    // As transformers does: the text ends where the final message's content does, so the
    // model continues it rather than starting a new turn.
    std::string final = request.messages.back()["content"].get<std::string>();
    final = std::string(absl::StripAsciiWhitespace(final));
    const size_t at = final.empty() ? std::string::npos : text->rfind(final);
    if (at == std::string::npos) {
      return InvalidField("continue_final_message",
                          "the chat template did not render the final message's content");
    }
    text->resize(at + final.size());
  }
  absl::StatusOr<std::vector<int32_t>> ids = tok->Encode(*text, add_special_tokens);
  if (!ids.ok()) return InvalidField("messages", std::string(ids.status().message()));
  if (ids->empty()) return InvalidField("messages", "the conversation renders to no tokens");
  return ids;
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
  // The chat form: the tokens /v1/chat/completions would prefill for these messages.
  absl::StatusOr<std::vector<int32_t>> ids =
      parsed->chat.has_value() ? ChatPrompt(*parsed->chat, parsed->add_special_tokens)
                               : tok->Encode(parsed->prompt, parsed->add_special_tokens);
  if (!ids.ok()) {
    ReplyError(responder, parsed->chat.has_value()
                              ? ids.status()
                              : InvalidField("prompt", std::string(ids.status().message())));
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
