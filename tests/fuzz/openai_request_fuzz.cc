// libFuzzer target: the HTTP door's parse of OpenAI request bodies (/v1/completions,
// /v1/chat/completions, /tokenize, /detokenize). Every input is accepted within the limits or
// refused with an error whose body is valid JSON in OpenAI's shape; nothing crashes or hangs.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "router/http/openai_protocol.h"

namespace {

void CheckError(const absl::Status& status) {
  const tandem::router::ApiError e = tandem::router::ToApiError(status);
  const nlohmann::json body = nlohmann::json::parse(e.body);  // throws (aborts) if not JSON
  if (!body["error"]["message"].is_string() || e.http_status < 400) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string body(reinterpret_cast<const char*>(data), size);
  const tandem::router::OpenAiLimits limits{.model_name = "m", .context_length = 2048,
                                            .max_n = 4, .max_prompts = 4, .max_choices = 8};
  auto completion = tandem::router::ParseCompletionRequest(body, limits);
  if (completion.ok()) {
    const auto& r = *completion;
    if (r.prompts.empty() || r.n < 1 || r.n > limits.max_n ||
        static_cast<int>(r.prompts.size()) * r.n > limits.max_choices) {
      std::abort();
    }
    for (const auto& p : r.prompts) {
      if (p.prompt().empty() == (p.prompt_token_ids_size() == 0)) std::abort();
      if (p.sampling().max_tokens() < 1) std::abort();
      // Prompt log-probabilities come only with echo; max_tokens 0 only with echo.
      if (p.sampling().prompt_logprobs() && !r.echo) std::abort();
    }
    if ((r.generate_none && !r.echo) || r.prompt_texts.size() != r.prompts.size()) std::abort();
  } else {
    CheckError(completion.status());
  }
  if (auto chat = tandem::router::ParseChatRequest(body, limits); chat.ok()) {
    if (chat->messages.empty() || chat->completion.n < 1 || chat->completion.n > limits.max_n ||
        chat->max_tokens < 0 || (chat->continue_final_message && chat->add_generation_prompt)) {
      std::abort();
    }
  } else {
    CheckError(chat.status());
  }
  if (auto t = tandem::router::ParseTokenizeRequest(body, limits); !t.ok()) {
    CheckError(t.status());
  } else if (t->chat.has_value() && t->chat->messages.empty()) {
    std::abort();
  }
  if (auto d = tandem::router::ParseDetokenizeRequest(body, limits); !d.ok()) {
    CheckError(d.status());
  }
  return 0;
}
