#include "router/request_validation.h"

#include <cmath>

#include <grpcpp/support/proto_buffer_reader.h>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "common/util/utf8.h"
#include "tandem/v1/inference_wire.pb.h"

namespace tandem::router {
namespace {

absl::Status CheckUtf8(const std::string& text, const std::string& field) {
  const absl::Status s = ValidateUtf8(text);
  if (s.ok()) return s;
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", s.message()));
}

constexpr char kFieldPayload[] = "tandem.dev/field";

}  // namespace

absl::Status WithField(absl::Status status, const std::string& field) {
  status.SetPayload(kFieldPayload, absl::Cord(field));
  return status;
}

absl::Status InvalidField(const std::string& field, const std::string& message) {
  return WithField(absl::InvalidArgumentError(message), field);
}

std::string FieldOf(const absl::Status& status) {
  const auto field = status.GetPayload(kFieldPayload);
  return field.has_value() ? std::string(*field) : std::string();
}

absl::StatusOr<tandem::v1::GenerateRequest> ParseGenerateRequest(const grpc::ByteBuffer& bytes) {
  tandem::v1::wire::GenerateRequest wire;
  grpc::ByteBuffer copy(bytes);  // the reader consumes its buffer
  grpc::ProtoBufferReader reader(&copy);
  if (!wire.ParseFromZeroCopyStream(&reader)) {
    return absl::InvalidArgumentError("the request is not a valid tandem.v1.GenerateRequest");
  }
  if (absl::Status s = CheckUtf8(wire.request_id(), "request_id"); !s.ok()) return s;
  tandem::v1::GenerateRequest r;
  r.set_request_id(wire.request_id());
  if (absl::Status s = CheckUtf8(wire.prompt(), "prompt"); !s.ok()) return s;
  r.set_prompt(wire.prompt());
  r.mutable_prompt_token_ids()->Add(wire.prompt_token_ids().begin(), wire.prompt_token_ids().end());
  if (absl::Status s = CheckUtf8(wire.cache_salt(), "cache_salt"); !s.ok()) return s;
  r.set_cache_salt(wire.cache_salt());
  const tandem::v1::wire::SamplingParams& ws = wire.sampling();
  tandem::v1::SamplingParams* s = r.mutable_sampling();
  s->set_temperature(ws.temperature());
  s->set_top_p(ws.top_p());
  s->set_top_k(ws.top_k());
  s->set_seed(ws.seed());
  s->set_max_tokens(ws.max_tokens());
  for (int i = 0; i < ws.stop_size(); ++i) {
    if (absl::Status e = CheckUtf8(ws.stop(i), absl::StrCat("sampling.stop[", i, "]")); !e.ok()) {
      return e;
    }
    s->add_stop(ws.stop(i));
  }
  s->set_ignore_eos(ws.ignore_eos());
  s->set_presence_penalty(ws.presence_penalty());
  s->set_frequency_penalty(ws.frequency_penalty());
  s->set_repetition_penalty(ws.repetition_penalty());
  s->set_logprobs(ws.logprobs());
  s->set_top_logprobs(ws.top_logprobs());
  s->set_prompt_logprobs(ws.prompt_logprobs());
  s->set_seeded(ws.seeded());
  return r;
}

absl::Status ValidateSampling(const tandem::v1::SamplingParams& s, const ModelLimits& limits) {
  if (std::isnan(s.temperature()) || s.temperature() < 0) {
    return InvalidField("sampling.temperature",
        absl::StrCat("sampling.temperature must be >= 0 (0 = greedy), got ", s.temperature()));
  }
  if (std::isnan(s.top_p()) || s.top_p() < 0 || s.top_p() > 1) {
    return InvalidField("sampling.top_p",
        absl::StrCat("sampling.top_p must be in (0, 1] (0 = off), got ", s.top_p()));
  }
  if (s.top_k() < 0) {
    return InvalidField("sampling.top_k",
        absl::StrCat("sampling.top_k must be >= 0 (0 = off), got ", s.top_k()));
  }
  if (s.max_tokens() <= 0) {
    return InvalidField("sampling.max_tokens",
        absl::StrCat("sampling.max_tokens is required and must be > 0, got ", s.max_tokens()));
  }
  if (limits.max_tokens > 0 && s.max_tokens() > limits.max_tokens) {
    return InvalidField("sampling.max_tokens",
                        absl::StrCat("sampling.max_tokens is ", s.max_tokens(),
                                     "; this server's "
                                     "limit is ",
                                     limits.max_tokens, " (router.max_tokens)"));
  }
  for (const auto& [name, v] :
       {std::pair<const char*, float>{"sampling.presence_penalty", s.presence_penalty()},
        {"sampling.frequency_penalty", s.frequency_penalty()}}) {
    if (std::isnan(v) || v < -2 || v > 2) {
      return InvalidField(name, absl::StrCat(name, " must be in [-2, 2] (0 = off), got ", v));
    }
  }
  if (std::isnan(s.repetition_penalty()) || std::isinf(s.repetition_penalty()) ||
      s.repetition_penalty() < 0) {
    return InvalidField("sampling.repetition_penalty",
                        absl::StrCat("sampling.repetition_penalty must be > 0 (0 = off), got ",
                                     s.repetition_penalty()));
  }
  if (s.top_logprobs() < 0 || s.top_logprobs() > limits.max_logprobs) {
    return InvalidField("sampling.top_logprobs",
                        absl::StrCat("sampling.top_logprobs must be in [0, ", limits.max_logprobs,
                                     "] (router.max_logprobs), got ", s.top_logprobs()));
  }
  if (s.top_logprobs() > 0 && !s.logprobs() && !s.prompt_logprobs()) {
    return InvalidField("sampling.top_logprobs",
                        "sampling.top_logprobs needs sampling.logprobs or prompt_logprobs set");
  }
  if (s.stop_size() > limits.max_stop_strings) {
    return InvalidField("sampling.stop",
                        absl::StrCat("sampling.stop: at most ", limits.max_stop_strings,
                                     " strings (router.max_stop_strings), got ", s.stop_size()));
  }
  for (int i = 0; i < s.stop_size(); ++i) {
    if (s.stop(i).empty() || s.stop(i).size() > static_cast<size_t>(limits.max_stop_bytes)) {
      return InvalidField(
          "sampling.stop",
          absl::StrCat("sampling.stop[", i, "] must be 1 to ", limits.max_stop_bytes,
                       " bytes long (router.max_stop_bytes), got ", s.stop(i).size()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> PromptTokens(const tandem::v1::GenerateRequest& request,
                                                  const tokenizer::Tokenizer* tokenizer,
                                                  const ModelLimits& limits) {
  const bool has_text = !request.prompt().empty();
  const bool has_ids = request.prompt_token_ids_size() > 0;
  if (has_text && has_ids) {
    return InvalidField("prompt", "set exactly one of prompt and prompt_token_ids, not both");
  }
  if (!has_text && !has_ids) {
    return InvalidField("prompt", "empty prompt: set prompt or prompt_token_ids");
  }
  std::vector<int32_t> ids;
  if (has_text) {
    if (tokenizer == nullptr) {
      return InvalidField(
          "prompt", "this model has no tokenizer.json: send prompt_token_ids instead of prompt");
    }
    absl::StatusOr<std::vector<int32_t>> encoded =
        tokenizer->Encode(request.prompt(), /*add_special_tokens=*/true);
    if (!encoded.ok()) {
      return InvalidField("prompt", absl::StrCat("prompt: ", encoded.status().message()));
    }
    ids = std::move(*encoded);
    if (ids.empty()) return InvalidField("prompt", "prompt encodes to no tokens");
  } else {
    ids.assign(request.prompt_token_ids().begin(), request.prompt_token_ids().end());
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] < 0 || ids[i] >= limits.vocab_size) {
        return InvalidField("prompt_token_ids", absl::StrCat("prompt_token_ids[", i, "] = ", ids[i],
                                                       " is outside the vocabulary [0, ",
                                                       limits.vocab_size, ")"));
      }
    }
  }
  const int64_t n = static_cast<int64_t>(ids.size());
  if (limits.max_prompt_tokens > 0 && n > limits.max_prompt_tokens) {
    return InvalidField(has_text ? "prompt" : "prompt_token_ids",
                        absl::StrCat("the prompt has ", n, " tokens; this server's limit is ",
                                     limits.max_prompt_tokens, " (router.max_prompt_tokens)"));
  }
  if (n >= limits.context_length) {
    return InvalidField("prompt", absl::StrCat("the prompt has ", n,
                                                   " tokens; the context length is ",
                                                   limits.context_length));
  }
  const int64_t max_tokens = request.sampling().max_tokens();
  if (n + max_tokens > limits.context_length) {
    return InvalidField("sampling.max_tokens", absl::StrCat(
        "prompt (", n, " tokens) + sampling.max_tokens (", max_tokens,
        ") exceeds the context length ", limits.context_length));
  }
  return ids;
}

}  // namespace tandem::router
