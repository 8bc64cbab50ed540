#include "router/http/openai_format.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/security/api_keys.h"
#include "common/util/utf8.h"
#include "router/http/openai_protocol.h"

namespace tandem::router {
namespace {

using json = OrderedJson;

std::string SseEvent(const json& v) { return absl::StrCat("data: ", Dump(v), "\n\n"); }

struct TokenText {
  std::string text;  // the token's text, or "bytes:\xNN..." when it is part of a character
  std::vector<uint8_t> bytes;
};

TokenText TextOf(const tokenizer::Tokenizer* tokenizer, int32_t id) {
  if (tokenizer == nullptr) return {absl::StrCat("token_id:", id), {}};
  absl::StatusOr<std::string> bytes = tokenizer->DecodeBytes({id}, false);
  if (!bytes.ok()) return {absl::StrCat("token_id:", id), {}};
  TokenText t{.text = "", .bytes = std::vector<uint8_t>(bytes->begin(), bytes->end())};
  if (ValidateUtf8(*bytes).ok()) {
    t.text = *std::move(bytes);
  } else {
    t.text = "bytes:";
    for (unsigned char b : t.bytes) absl::StrAppend(&t.text, absl::StrFormat("\\x%02x", b));
  }
  return t;
}

}  // namespace

std::string Dump(const json& v) { return v.dump(-1, ' ', false, json::error_handler_t::replace); }

void ReplyJson(HttpResponder& responder, int status, const json& body) {
  responder.Reply(status, "application/json", Dump(body));
}

void ReplyError(HttpResponder& responder, const absl::Status& status) {
  const ApiError e = ToApiError(status);
  HttpHeaders headers;
  if (e.http_status == 429) {
    headers.emplace_back("Retry-After",
                         absl::StrCat(security::RetryAfterSeconds(status).value_or(1)));
  }
  if (e.http_status == 401) headers.emplace_back("WWW-Authenticate", "Bearer");
  responder.Reply(e.http_status, "application/json", e.body, std::move(headers));
}

ResponseFormat::ResponseFormat(Endpoint endpoint, std::string model, int64_t created,
                               bool include_usage)
    : endpoint_(endpoint),
      id_(endpoint == Endpoint::kChat ? "chat" + NewCompletionId() : NewCompletionId()),
      model_(std::move(model)),
      created_(created),
      include_usage_(include_usage) {
  // Envelope({{"index": ...}}) as text, split around the index and the text.
  json head = Envelope(json::array(), /*whole=*/false);
  head.erase("usage");
  const std::string h = Dump(head);
  head_ = absl::StrCat("data: ", h.substr(0, h.size() - 2), "{\"index\":");  // drops "]}"
  const char* usage = include_usage_ ? ",\"usage\":null" : "";
  if (endpoint_ == Endpoint::kChat) {
    mid_ = ",\"delta\":{\"content\":";
    tail_ = absl::StrCat("},\"logprobs\":null,\"finish_reason\":null}]", usage, "}\n\n");
  } else {
    mid_ = ",\"text\":";
    tail_ = absl::StrCat(",\"logprobs\":null,\"finish_reason\":null}]", usage, "}\n\n");
  }
}

json ResponseFormat::Envelope(json choices, bool whole) const {
  const char* object = endpoint_ == Endpoint::kCompletions ? "text_completion"
                       : whole                             ? "chat.completion"
                                                           : "chat.completion.chunk";
  json out = {{"id", id_},
              {"object", object},
              {"created", created_},
              {"model", model_},
              {"choices", std::move(choices)}};
  if (include_usage_ && !whole) out["usage"] = nullptr;
  return out;
}

std::string ResponseFormat::TextEvent(int index, const std::string& text) const {
  return absl::StrCat(head_, index, mid_, Dump(json(text)), tail_);
}

std::string ResponseFormat::TextEvent(int index, const std::string& text, json logprobs) const {
  json choice = {{"index", index}};
  if (endpoint_ == Endpoint::kChat) {
    choice["delta"] = {{"content", text}};
  } else {
    choice["text"] = text;
  }
  choice["logprobs"] = std::move(logprobs);
  choice["finish_reason"] = nullptr;
  return SseEvent(Envelope(json::array({std::move(choice)}), false));
}

std::string ResponseFormat::RoleEvent(int index) const {
  return SseEvent(Envelope(json::array({{{"index", index},
                                         {"delta", {{"role", "assistant"}, {"content", ""}}},
                                         {"logprobs", nullptr},
                                         {"finish_reason", nullptr}}}),
                           false));
}

std::string ResponseFormat::FinishEvent(int index, const std::string& finish_reason) const {
  json choice = {{"index", index}};
  if (endpoint_ == Endpoint::kChat) {
    choice["delta"] = json::object();
  } else {
    choice["text"] = "";
  }
  choice["logprobs"] = nullptr;
  choice["finish_reason"] = finish_reason;
  return SseEvent(Envelope(json::array({std::move(choice)}), false));
}

std::string ResponseFormat::UsageEvent(json usage) const {
  json event = Envelope(json::array(), false);
  event["usage"] = std::move(usage);
  return SseEvent(event);
}

json ResponseFormat::Body(const std::vector<ChoiceResult>& choices, json usage) const {
  json out = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    json c = {{"index", i}};
    if (endpoint_ == Endpoint::kChat) {
      c["message"] = {{"role", "assistant"}, {"content", choices[i].text}};
    } else {
      c["text"] = choices[i].text;
    }
    c["logprobs"] = choices[i].logprobs;
    c["finish_reason"] = choices[i].finish_reason;
    out.push_back(std::move(c));
  }
  json body = Envelope(std::move(out), true);
  body["usage"] = std::move(usage);
  return body;
}

json ResponseFormat::EmptyLogprobs() const {
  if (endpoint_ == Endpoint::kChat) return {{"content", json::array()}};
  return {{"tokens", json::array()},
          {"token_logprobs", json::array()},
          {"top_logprobs", json::array()},
          {"text_offset", json::array()}};
}

json ResponseFormat::ChunkLogprobs(const tandem::v1::Chunk& chunk,
                                   const tokenizer::Tokenizer* tokenizer, int64_t& offset) const {
  json out = EmptyLogprobs();
  for (int i = 0; i < chunk.token_ids_size() && i < chunk.logprobs_size(); ++i) {
    AppendToken(out, chunk.token_ids(i), &chunk.logprobs(i), tokenizer, offset);
  }
  return out;
}

json ResponseFormat::PromptLogprobs(const tandem::v1::Chunk& chunk,
                                    const tokenizer::Tokenizer* tokenizer,
                                    int64_t& offset) const {
  json out = EmptyLogprobs();
  for (int i = 0; i < chunk.prompt_token_ids_size(); ++i) {
    // The first token has nothing before it, so no log-probability.
    const tandem::v1::TokenLogprobs* lp =
        i > 0 && i - 1 < chunk.prompt_logprobs_size() ? &chunk.prompt_logprobs(i - 1) : nullptr;
    AppendToken(out, chunk.prompt_token_ids(i), lp, tokenizer, offset);
  }
  return out;
}

void ResponseFormat::AppendToken(json& out, int32_t id, const tandem::v1::TokenLogprobs* lp,
                                 const tokenizer::Tokenizer* tokenizer, int64_t& offset) const {
  const TokenText token = TextOf(tokenizer, id);
  const int alternatives =
      lp == nullptr ? 0 : std::min(lp->top_token_ids_size(), lp->top_logprobs_size());
  if (endpoint_ == Endpoint::kChat) {
    json top = json::array();
    for (int j = 0; j < alternatives; ++j) {
      const TokenText t = TextOf(tokenizer, lp->top_token_ids(j));
      top.push_back({{"token", t.text}, {"logprob", lp->top_logprobs(j)}, {"bytes", t.bytes}});
    }
    out["content"].push_back({{"token", token.text},
                              {"logprob", lp == nullptr ? json(nullptr) : json(lp->logprob())},
                              {"bytes", token.bytes},
                              {"top_logprobs", std::move(top)}});
    return;
  }
  json top = json::object();
  for (int j = 0; j < alternatives; ++j) {
    top[TextOf(tokenizer, lp->top_token_ids(j)).text] = lp->top_logprobs(j);
  }
  out["tokens"].push_back(token.text);
  out["token_logprobs"].push_back(lp == nullptr ? json(nullptr) : json(lp->logprob()));
  out["top_logprobs"].push_back(lp == nullptr ? json(nullptr) : std::move(top));
  out["text_offset"].push_back(offset);
  offset += static_cast<int64_t>(token.text.size());
}

void ResponseFormat::AppendLogprobs(json& to, const json& chunk) const {
  for (auto it = chunk.begin(); it != chunk.end(); ++it) {
    for (const json& v : it.value()) to[it.key()].push_back(v);
  }
}

}  // namespace tandem::router
