// The JSON the OpenAI API answers with, for /v1/completions and /v1/chat/completions: whole
// responses, SSE events, log-probabilities, errors. One ResponseFormat per request; it knows
// the request's id, model and endpoint, and writes the per-token events from prebuilt pieces
// (they run once per token per stream).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"
#include "router/http/http_server.h"
#include "tandem/v1/inference.pb.h"

namespace tandem::router {

using OrderedJson = nlohmann::ordered_json;  // keys in the order OpenAI sends them

enum class Endpoint { kCompletions, kChat };

// What one choice came to, for the whole (non-streamed) response.
struct ChoiceResult {
  std::string text;
  OrderedJson logprobs;  // null unless asked for
  std::string finish_reason;
};

class ResponseFormat {
 public:
  ResponseFormat(Endpoint endpoint, std::string model, int64_t created, bool include_usage);

  const std::string& id() const { return id_; }
  Endpoint endpoint() const { return endpoint_; }

  // SSE events ("data: ...\n\n").
  std::string TextEvent(int index, const std::string& text) const;
  std::string TextEvent(int index, const std::string& text, OrderedJson logprobs) const;
  std::string RoleEvent(int index) const;  // chat: the first event of each choice
  std::string FinishEvent(int index, const std::string& finish_reason) const;
  std::string UsageEvent(OrderedJson usage) const;

  // The whole response.
  OrderedJson Body(const std::vector<ChoiceResult>& choices, OrderedJson usage) const;

  // Log-probabilities: an empty accumulator, one chunk's (token text via `tokenizer`, which
  // may be null; `offset` is the completions endpoint's running text_offset), and appending a
  // chunk's to the accumulator.
  OrderedJson EmptyLogprobs() const;
  OrderedJson ChunkLogprobs(const tandem::v1::Chunk& chunk, const tokenizer::Tokenizer* tokenizer,
                            int64_t& offset) const;
  void AppendLogprobs(OrderedJson& to, const OrderedJson& chunk) const;
  // The completions endpoint's `echo`: a first chunk's prompt tokens, the first with null
  // log-probabilities (nothing comes before it).
  OrderedJson PromptLogprobs(const tandem::v1::Chunk& chunk, const tokenizer::Tokenizer* tokenizer,
                             int64_t& offset) const;

 private:
  // One token's entry; `lp` null for none.
  void AppendToken(OrderedJson& out, int32_t id, const tandem::v1::TokenLogprobs* lp,
                   const tokenizer::Tokenizer* tokenizer, int64_t& offset) const;
  OrderedJson Envelope(OrderedJson choices, bool whole) const;

  const Endpoint endpoint_;
  const std::string id_;
  const std::string model_;
  const int64_t created_;
  const bool include_usage_;
  std::string head_;  // a text event up to the choice's index
  std::string mid_;   // from after the index to the text
  std::string tail_;  // after the text
};

std::string Dump(const OrderedJson& v);
void ReplyJson(HttpResponder& responder, int status, const OrderedJson& body);
// The OpenAI error body for `status`, with Retry-After on 429.
void ReplyError(HttpResponder& responder, const absl::Status& status);

}  // namespace tandem::router
