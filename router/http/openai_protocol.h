// The OpenAI HTTP API's JSON, translated to and from tandem.v1 (the gRPC API's messages), so
// both front doors feed one request path. Parsing checks every field's type and refuses, by
// name, the fields Tandem does not support when they are set to anything but their default, and
// fields it does not know at all: nothing a client asks for is silently ignored.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/security/api_keys.h"
#include "nlohmann/json.hpp"
#include "tandem/v1/inference.pb.h"

namespace tandem::router {

// What the OpenAI door serves, and its limits on what a request may ask for.
struct OpenAiLimits {
  std::string model_name;
  int64_t context_length = 0;
  int max_n = 16;        // choices per prompt
  int max_prompts = 16;  // prompts in one /v1/completions request
  int max_choices = 64;  // prompts x n
  int max_logprobs = 20;  // logprobs / top_logprobs (router.max_logprobs)
  bool health_needs_key = false;  // with API keys: GET /health asks for one too
};

// A parsed /v1/completions request: one GenerateRequest per prompt, each `n` times.
struct CompletionRequest {
  std::string model;
  std::vector<tandem::v1::GenerateRequest> prompts;
  int n = 1;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  std::string user;
  std::string cache_salt;  // extension (vLLM's): requests share cached blocks only within a salt
  // Completions: each choice's text starts with its prompt's (`prompt_texts`, one per prompt),
  // and with logprobs its log-probabilities with the prompt's (sampling.prompt_logprobs).
  bool echo = false;
  std::vector<std::string> prompt_texts;  // filled by the door for token-id prompts
  // max_tokens 0 (only with echo): the one token the workers generate is dropped.
  bool generate_none = false;
  // The API key's hold on its quota, shared by the request's choices (null without keys).
  std::shared_ptr<security::KeyLease> lease = nullptr;
};

// InvalidArgument (naming the field) for bad JSON, types, values and unsupported fields;
// NotFound for another model.
absl::StatusOr<CompletionRequest> ParseCompletionRequest(std::string_view body,
                                                         const OpenAiLimits& limits);

// A conversation as chat templates read it: what /v1/chat/completions and the chat form of
// /tokenize take, before the template renders it.
struct Conversation {
  nlohmann::ordered_json messages;  // [{role, content (a string), name?}]
  bool add_generation_prompt = true;
  bool continue_final_message = false;
  nlohmann::ordered_json template_kwargs = nlohmann::ordered_json::object();
};

// A parsed /v1/chat/completions request, before its template is rendered: `completion` has no
// prompts yet, and `sampling` no max_tokens (the door sets both once it knows the prompt).
struct ChatRequest : Conversation {
  CompletionRequest completion;
  int64_t max_tokens = 0;  // 0: until the context is full
  tandem::v1::SamplingParams sampling;
};
absl::StatusOr<ChatRequest> ParseChatRequest(std::string_view body, const OpenAiLimits& limits);

// POST /tokenize (vLLM's shapes): {"model"?, "prompt", "add_special_tokens"? (default true)},
// or the chat form {"model"?, "messages", "add_generation_prompt"?, "continue_final_message"?,
// "chat_template_kwargs"?, "add_special_tokens"? (default false: the template places them)}.
struct TokenizeRequest {
  std::string prompt;
  bool add_special_tokens = true;
  std::optional<Conversation> chat;  // the chat form
};
absl::StatusOr<TokenizeRequest> ParseTokenizeRequest(std::string_view body,
                                                     const OpenAiLimits& limits);
// POST /detokenize {"model"?, "tokens": [ids]}: the ids.
absl::StatusOr<std::vector<int32_t>> ParseDetokenizeRequest(std::string_view body,
                                                            const OpenAiLimits& limits);

// The error body OpenAI clients read: {"error": {"message", "type", "param", "code"}}, with the
// HTTP status that goes with `status`. `param` names the request field, in the OpenAI API's
// terms, when the status names one (InvalidField).
struct ApiError {
  int http_status = 500;
  std::string body;  // JSON
};
ApiError ToApiError(const absl::Status& status);
int HttpStatusOf(absl::StatusCode code);

// The OpenAI name of a tandem.v1 request field ("sampling.max_tokens" -> "max_tokens").
std::string OpenAiParam(std::string_view field);

// "cmpl-" and 24 random hex digits.
std::string NewCompletionId();



}  // namespace tandem::router
