#include "router/http/openai_protocol.h"

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "router/request_validation.h"

namespace tandem::router {
namespace {

using nlohmann::json;

std::string TypeName(const json& v) {
  if (v.is_number_integer()) return "an integer";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_boolean()) return "a boolean";
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  return "null";
}

absl::Status WrongType(const std::string& name, const std::string& want, const json& v) {
  return InvalidField(name, absl::StrCat(name, " must be ", want, ", got ", TypeName(v)));
}

// The fields of one JSON request object, read by name; whatever is left unread at the end is a
// field Tandem does not know.
class Fields {
 public:
  explicit Fields(const json& object) : object_(object) {}

  // The value of `name`; null when absent (JSON null reads as absent too).
  const json* Get(const std::string& name) {
    seen_.insert(std::string(name));
    auto it = object_.find(name);
    if (it == object_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  absl::StatusOr<bool> Bool(const std::string& name, bool fallback) {
    const json* v = Get(name);
    if (v == nullptr) return fallback;
    if (!v->is_boolean()) return WrongType(name, "a boolean", *v);
    return v->get<bool>();
  }

  absl::StatusOr<double> Number(const std::string& name, double fallback) {
    const json* v = Get(name);
    if (v == nullptr) return fallback;
    if (!v->is_number()) return WrongType(name, "a number", *v);
    return v->get<double>();
  }

  absl::StatusOr<int64_t> Integer(const std::string& name, int64_t fallback, int64_t lo,
                                  int64_t hi) {
    const json* v = Get(name);
    if (v == nullptr) return fallback;
    int64_t x = 0;
    if (v->is_number_unsigned()) {
      const uint64_t u = v->get<uint64_t>();
      if (u > static_cast<uint64_t>(hi)) return OutOfRange(name, lo, hi);
      x = static_cast<int64_t>(u);
    } else if (v->is_number_integer()) {
      x = v->get<int64_t>();
    } else if (v->is_number_float() && std::isfinite(v->get<double>()) &&
               v->get<double>() == std::floor(v->get<double>()) && std::abs(v->get<double>()) < 1e15) {
      x = static_cast<int64_t>(v->get<double>());  // 16.0 is 16, as in JSON Schema
    } else {
      return WrongType(name, "an integer", *v);
    }
    if (x < lo || x > hi) return OutOfRange(name, lo, hi);
    return x;
  }

  absl::StatusOr<std::string> String(const std::string& name) {
    const json* v = Get(name);
    if (v == nullptr) return std::string();
    if (!v->is_string()) return WrongType(name, "a string", *v);
    return v->get<std::string>();
  }

  // A field Tandem does not support yet: accepted only at its default (absent, null, or one of
  // `defaults`).
  absl::Status Unsupported(const std::string& name, std::initializer_list<json> defaults = {}) {
    const json* v = Get(name);
    if (v == nullptr) return absl::OkStatus();
    for (const json& d : defaults) {
      if (*v == d) return absl::OkStatus();
    }
    return InvalidField(name, absl::StrCat(name, " is not supported by this server"));
  }

  absl::Status CheckNoOthers() const {
    for (auto it = object_.begin(); it != object_.end(); ++it) {
      if (!seen_.contains(it.key())) {
        return InvalidField(it.key(), absl::StrCat("unrecognized request argument: ", it.key()));
      }
    }
    return absl::OkStatus();
  }

 private:
  static absl::Status OutOfRange(const std::string& name, int64_t lo, int64_t hi) {
    return InvalidField(name, absl::StrCat(name, " must be an integer in [", lo, ", ", hi, "]"));
  }

  const json& object_;
  absl::flat_hash_set<std::string> seen_;
};

absl::StatusOr<json> ParseObject(std::string_view body) {
  json v = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (v.is_discarded()) {
    // Parse again for the message (rare: only bad requests pay for it).
    try {
      json again = json::parse(body);
      return absl::InternalError(absl::StrCat("the body parsed the second time: ", again.dump()));
    } catch (const json::exception& e) {
      return absl::InvalidArgumentError(absl::StrCat("the body is not valid JSON: ", e.what()));
    }
    return absl::InvalidArgumentError("the body is not valid JSON");
  }
  if (!v.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the body must be a JSON object, got ", TypeName(v)));
  }
  return v;
}

// prompt: a string, an array of token ids, or an array of either (several prompts).
absl::StatusOr<std::vector<tandem::v1::GenerateRequest>> ParsePrompts(const json* v,
                                                                      const OpenAiLimits& limits) {
  if (v == nullptr) return InvalidField("prompt", "prompt is required");
  std::vector<tandem::v1::GenerateRequest> out;
  auto add_ids = [&](const json& ids) -> absl::Status {
    tandem::v1::GenerateRequest r;
    for (const json& t : ids) {
      if (!t.is_number_integer() ||
          t.get<int64_t>() < std::numeric_limits<int32_t>::min() ||
          t.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
        return InvalidField("prompt", "a token-id prompt must hold only 32-bit integers");
      }
      r.add_prompt_token_ids(t.get<int32_t>());
    }
    if (r.prompt_token_ids_size() == 0) return InvalidField("prompt", "prompt is empty");
    out.push_back(std::move(r));
    return absl::OkStatus();
  };
  if (v->is_string()) {
    out.emplace_back().set_prompt(v->get<std::string>());
  } else if (v->is_array() && !v->empty() && v->front().is_number()) {
    if (absl::Status s = add_ids(*v); !s.ok()) return s;
  } else if (v->is_array() && !v->empty()) {
    if (static_cast<int>(v->size()) > limits.max_prompts) {
      return InvalidField("prompt", absl::StrCat("at most ", limits.max_prompts,
                                                 " prompts in one request, got ", v->size()));
    }
    for (const json& p : *v) {
      if (p.is_string()) {
        out.emplace_back().set_prompt(p.get<std::string>());
      } else if (p.is_array()) {
        if (absl::Status s = add_ids(p); !s.ok()) return s;
      } else {
        return WrongType("prompt", "a string, an array of token ids, or an array of these", p);
      }
    }
  } else {
    return v->is_array() ? InvalidField("prompt", "prompt is empty")
                         : WrongType("prompt", "a string or an array", *v);
  }
  for (const auto& r : out) {
    if (r.prompt_token_ids_size() == 0 && r.prompt().empty()) {
      return InvalidField("prompt", "prompt is empty");
    }
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> ParseStop(const json* v) {
  std::vector<std::string> stop;
  if (v == nullptr) return stop;
  if (v->is_string()) {
    stop.push_back(v->get<std::string>());
  } else if (v->is_array()) {
    for (const json& s : *v) {
      if (!s.is_string()) return WrongType("stop", "a string or an array of strings", s);
      stop.push_back(s.get<std::string>());
    }
  } else {
    return WrongType("stop", "a string or an array of strings", *v);
  }
  return stop;
}

absl::Status CheckModel(Fields& f, const OpenAiLimits& limits) {
  absl::StatusOr<std::string> model = f.String("model");
  if (!model.ok()) return model.status();
  if (!model->empty() && *model != limits.model_name) {
    return WithField(absl::NotFoundError(absl::StrCat("the model `", *model,
                                                      "` does not exist; this server serves `",
                                                      limits.model_name, "`")),
                     "model");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<int32_t>> ParseDetokenizeRequest(std::string_view body,
                                                            const OpenAiLimits& limits) {
  absl::StatusOr<json> parsed = ParseObject(body);
  if (!parsed.ok()) return parsed.status();
  Fields f(*parsed);
  if (absl::Status s = CheckModel(f, limits); !s.ok()) return s;
  const json* tokens = f.Get("tokens");
  if (tokens == nullptr) return InvalidField("tokens", "tokens is required");
  if (!tokens->is_array()) return WrongType("tokens", "an array of token ids", *tokens);
  std::vector<int32_t> ids;
  for (const json& t : *tokens) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 ||
        t.get<int64_t>() >= std::numeric_limits<int32_t>::max()) {
      return InvalidField("tokens", "tokens must hold only token ids (integers >= 0)");
    }
    ids.push_back(t.get<int32_t>());
  }
  if (absl::Status s = f.CheckNoOthers(); !s.ok()) return s;
  return ids;
}

namespace {

// What both endpoints read alike: the sampling fields (with the OpenAI API's defaults, which
// differ from tandem.v1's zero values: temperature and top_p 1), n, streaming and the fields
// Tandem refuses. `max_tokens` (the endpoint's default) and the log-probability fields are the
// caller's.
absl::Status ParseShared(Fields& f, const OpenAiLimits& limits, CompletionRequest& out,
                         tandem::v1::SamplingParams& sp) {
  absl::StatusOr<double> temperature = f.Number("temperature", 1.0);
  absl::StatusOr<double> top_p = f.Number("top_p", 1.0);
  absl::StatusOr<int64_t> top_k = f.Integer("top_k", 0, -1, std::numeric_limits<int32_t>::max());
  absl::StatusOr<int64_t> seed = f.Integer("seed", 0, std::numeric_limits<int64_t>::min(),
                                           std::numeric_limits<int64_t>::max());
  absl::StatusOr<std::vector<std::string>> stop = ParseStop(f.Get("stop"));
  absl::StatusOr<bool> ignore_eos = f.Bool("ignore_eos", false);
  absl::StatusOr<int64_t> n = f.Integer("n", 1, 1, limits.max_n);
  absl::StatusOr<bool> stream = f.Bool("stream", false);
  absl::StatusOr<std::string> user = f.String("user");
  absl::StatusOr<std::string> cache_salt = f.String("cache_salt");
  absl::StatusOr<double> presence = f.Number("presence_penalty", 0);
  absl::StatusOr<double> frequency = f.Number("frequency_penalty", 0);
  absl::StatusOr<double> repetition = f.Number("repetition_penalty", 1);
  for (const absl::Status& s :
       {temperature.status(), top_p.status(), top_k.status(), seed.status(), stop.status(),
        ignore_eos.status(), n.status(), stream.status(), user.status(), cache_salt.status(),
        presence.status(), frequency.status(), repetition.status()}) {
    if (!s.ok()) return s;
  }
  if (*repetition <= 0) {
    return InvalidField("repetition_penalty",
                        absl::StrCat("repetition_penalty must be > 0 (1 = off), got ", *repetition));
  }
  if (const json* so = f.Get("stream_options"); so != nullptr) {
    if (!so->is_object()) return WrongType("stream_options", "an object", *so);
    if (!*stream) {
      return InvalidField("stream_options", "stream_options is only allowed when stream is true");
    }
    Fields sf(*so);
    absl::StatusOr<bool> usage = sf.Bool("include_usage", false);
    if (!usage.ok()) return usage.status();
    if (absl::Status s = sf.CheckNoOthers(); !s.ok()) {
      return InvalidField("stream_options", absl::StrCat("stream_options: ", s.message()));
    }
    out.include_usage = *usage;
  }
  for (absl::Status s :
       {f.Unsupported("best_of", {1}), f.Unsupported("logit_bias", {json::object()})}) {
    if (!s.ok()) return s;
  }
  sp.set_temperature(static_cast<float>(*temperature));
  sp.set_top_p(static_cast<float>(*top_p));
  sp.set_top_k(static_cast<int32_t>(std::max<int64_t>(0, *top_k)));  // -1: off, as in vLLM
  sp.set_seed(static_cast<uint64_t>(*seed));
  sp.set_seeded(f.Get("seed") != nullptr);  // seed 0 is a seed too
  for (auto& s : *stop) sp.add_stop(std::move(s));
  sp.set_ignore_eos(*ignore_eos);
  sp.set_presence_penalty(static_cast<float>(*presence));
  sp.set_frequency_penalty(static_cast<float>(*frequency));
  sp.set_repetition_penalty(static_cast<float>(*repetition));
  out.model = limits.model_name;
  out.n = static_cast<int>(*n);
  out.stream = *stream;
  out.user = std::move(*user);
  out.cache_salt = std::move(*cache_salt);
  return absl::OkStatus();
}

// content: a string, null, or text parts [{"type": "text", "text": ...}] (joined with "\n",
// as vLLM does for templates that take a string).
absl::StatusOr<std::string> ParseContent(const json* content, size_t i) {
  const std::string field = absl::StrCat("messages[", i, "].content");
  if (content == nullptr) return std::string();
  if (content->is_string()) return content->get<std::string>();
  if (!content->is_array()) return WrongType(field, "a string or an array of text parts", *content);
  std::string text;
  for (const json& part : *content) {
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string()) {
      return InvalidField(field, absl::StrCat(field, ": each part must be {\"type\": ...}"));
    }
    const std::string type = part["type"].get<std::string>();
    if (type != "text") {
      return InvalidField(field, absl::StrCat(field, ": content parts of type '", type,
                                              "' are not supported (text only)"));
    }
    if (!part.contains("text") || !part["text"].is_string()) {
      return InvalidField(field, absl::StrCat(field, ": a text part needs a string \"text\""));
    }
    if (!text.empty()) text += "\n";
    text += part["text"].get<std::string>();
  }
  return text;
}

absl::StatusOr<nlohmann::ordered_json> ParseMessages(const json* messages) {
  if (messages == nullptr) return InvalidField("messages", "messages is required");
  if (!messages->is_array() || messages->empty()) {
    return InvalidField("messages", "messages must be a non-empty array");
  }
  if (messages->size() > 4096) {
    return InvalidField("messages", "at most 4096 messages in one request");
  }
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (size_t i = 0; i < messages->size(); ++i) {
    const json& m = (*messages)[i];
    const std::string where = absl::StrCat("messages[", i, "]");
    if (!m.is_object()) return WrongType(where, "an object", m);
    Fields mf(m);
    absl::StatusOr<std::string> role = mf.String("role");
    if (!role.ok()) return InvalidField("messages", std::string(role.status().message()));
    if (*role != "system" && *role != "user" && *role != "assistant" && *role != "developer") {
      return InvalidField("messages", absl::StrCat(where, ".role must be system, user, "
                                                          "assistant or developer, got '",
                                                   *role, "'"));
    }
    absl::StatusOr<std::string> content = ParseContent(mf.Get("content"), i);
    if (!content.ok()) return content.status();
    absl::StatusOr<std::string> name = mf.String("name");
    if (!name.ok()) return InvalidField("messages", std::string(name.status().message()));
    for (absl::Status s : {mf.Unsupported("tool_calls", {json::array()}),
                           mf.Unsupported("function_call"), mf.Unsupported("refusal")}) {
      if (!s.ok()) return InvalidField("messages", absl::StrCat(where, ": ", s.message()));
    }
    if (absl::Status s = mf.CheckNoOthers(); !s.ok()) {
      return InvalidField("messages", absl::StrCat(where, ": ", s.message()));
    }
    nlohmann::ordered_json msg = {{"role", *role}, {"content", *content}};
    if (!name->empty()) msg["name"] = *name;
    out.push_back(std::move(msg));
  }
  return out;
}

}  // namespace

absl::StatusOr<CompletionRequest> ParseCompletionRequest(std::string_view body,
                                                         const OpenAiLimits& limits) {
  absl::StatusOr<json> parsed = ParseObject(body);
  if (!parsed.ok()) return parsed.status();
  Fields f(*parsed);
  CompletionRequest out;
  if (absl::Status s = CheckModel(f, limits); !s.ok()) return s;
  absl::StatusOr<std::vector<tandem::v1::GenerateRequest>> prompts =
      ParsePrompts(f.Get("prompt"), limits);
  if (!prompts.ok()) return prompts.status();
  tandem::v1::SamplingParams sp;
  if (absl::Status s = ParseShared(f, limits, out, sp); !s.ok()) return s;
  absl::StatusOr<bool> echo = f.Bool("echo", false);
  absl::StatusOr<int64_t> max_tokens =
      f.Integer("max_tokens", 16, 0, std::numeric_limits<int32_t>::max());
  // null (absent) is off; 0 asks for the sampled token's alone.
  absl::StatusOr<int64_t> logprobs = f.Integer("logprobs", -1, 0, limits.max_logprobs);
  for (const absl::Status& s : {echo.status(), max_tokens.status(), logprobs.status(),
                                f.Unsupported("suffix", {""}), f.CheckNoOthers()}) {
    if (!s.ok()) return s;
  }
  if (*max_tokens == 0 && !*echo) {
    return InvalidField("max_tokens", "max_tokens must be >= 1 (0 only with echo)");
  }
  if (static_cast<int64_t>(prompts->size()) * out.n > limits.max_choices) {
    return InvalidField("n", absl::StrCat("prompts x n must be at most ", limits.max_choices));
  }
  // max_tokens 0 with echo: the prompt's text and log-probabilities alone (how evaluation
  // harnesses score a text). The workers always generate a token; this one is dropped.
  out.echo = *echo;
  out.generate_none = *max_tokens == 0;
  sp.set_max_tokens(static_cast<int32_t>(std::max<int64_t>(1, *max_tokens)));
  if (*logprobs >= 0) {
    sp.set_logprobs(true);
    sp.set_top_logprobs(static_cast<int32_t>(*logprobs));
    sp.set_prompt_logprobs(*echo);
  }
  for (auto& r : *prompts) {
    *r.mutable_sampling() = sp;
    out.prompt_texts.push_back(r.prompt());
  }
  out.prompts = std::move(*prompts);
  return out;
}

namespace {

// The conversation fields, and the chat fields Tandem refuses (tools and the like).
absl::Status ParseConversation(Fields& f, Conversation& out) {
  absl::StatusOr<nlohmann::ordered_json> messages = ParseMessages(f.Get("messages"));
  if (!messages.ok()) return messages.status();
  out.messages = std::move(*messages);
  absl::StatusOr<bool> generation_prompt = f.Bool("add_generation_prompt", true);
  absl::StatusOr<bool> continue_final = f.Bool("continue_final_message", false);
  for (const absl::Status& s : {generation_prompt.status(), continue_final.status()}) {
    if (!s.ok()) return s;
  }
  if (const json* kwargs = f.Get("chat_template_kwargs"); kwargs != nullptr) {
    if (!kwargs->is_object()) return WrongType("chat_template_kwargs", "an object", *kwargs);
    out.template_kwargs = nlohmann::ordered_json::parse(kwargs->dump());
  }
  for (absl::Status s :
       {f.Unsupported("tools", {json::array()}), f.Unsupported("tool_choice", {"none"}),
        f.Unsupported("parallel_tool_calls"), f.Unsupported("functions"),
        f.Unsupported("function_call", {"none"}),
        f.Unsupported("response_format", {json{{"type", "text"}}})}) {
    if (!s.ok()) return s;
  }
  if (*continue_final && *generation_prompt && f.Get("add_generation_prompt") != nullptr) {
    return InvalidField("continue_final_message",
                        "continue_final_message and add_generation_prompt cannot both be true");
  }
  if (*continue_final && out.messages.back()["role"] != "assistant") {
    return InvalidField("continue_final_message",
                        "continue_final_message needs the last message to be the assistant's");
  }
  out.add_generation_prompt = *generation_prompt && !*continue_final;
  out.continue_final_message = *continue_final;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TokenizeRequest> ParseTokenizeRequest(std::string_view body,
                                                     const OpenAiLimits& limits) {
  absl::StatusOr<json> parsed = ParseObject(body);
  if (!parsed.ok()) return parsed.status();
  Fields f(*parsed);
  if (absl::Status s = CheckModel(f, limits); !s.ok()) return s;
  TokenizeRequest out;
  const json* prompt = f.Get("prompt");
  if (f.Get("messages") != nullptr) {
    if (prompt != nullptr) {
      return InvalidField("prompt", "give either prompt or messages, not both");
    }
    if (absl::Status s = ParseConversation(f, out.chat.emplace()); !s.ok()) return s;
  } else if (prompt == nullptr) {
    return InvalidField("prompt", "prompt (or messages) is required");
  } else if (!prompt->is_string()) {
    return WrongType("prompt", "a string", *prompt);
  } else {
    out.prompt = prompt->get<std::string>();
  }
  // A chat template places the special tokens itself.
  absl::StatusOr<bool> special = f.Bool("add_special_tokens", !out.chat.has_value());
  if (!special.ok()) return special.status();
  out.add_special_tokens = *special;
  if (absl::Status s = f.CheckNoOthers(); !s.ok()) return s;
  return out;
}

absl::StatusOr<ChatRequest> ParseChatRequest(std::string_view body, const OpenAiLimits& limits) {
  absl::StatusOr<json> parsed = ParseObject(body);
  if (!parsed.ok()) return parsed.status();
  Fields f(*parsed);
  ChatRequest out;
  if (absl::Status s = CheckModel(f, limits); !s.ok()) return s;
  if (absl::Status s = ParseConversation(f, out); !s.ok()) return s;
  tandem::v1::SamplingParams sp;
  if (absl::Status s = ParseShared(f, limits, out.completion, sp); !s.ok()) return s;
  // max_completion_tokens, or the older max_tokens; neither: until the context is full.
  const int64_t kMax = std::numeric_limits<int32_t>::max();
  absl::StatusOr<int64_t> max_completion = f.Integer("max_completion_tokens", 0, 1, kMax);
  absl::StatusOr<int64_t> max_tokens = f.Integer("max_tokens", 0, 1, kMax);
  absl::StatusOr<bool> logprobs = f.Bool("logprobs", false);
  absl::StatusOr<int64_t> top_logprobs = f.Integer("top_logprobs", 0, 0, limits.max_logprobs);
  for (const absl::Status& s : {max_completion.status(), max_tokens.status(), logprobs.status(),
                                top_logprobs.status(), f.Unsupported("echo", {false}),
                                f.CheckNoOthers()}) {
    if (!s.ok()) return s;
  }
  if (*top_logprobs > 0 && !*logprobs) {
    return InvalidField("top_logprobs", "top_logprobs needs logprobs set to true");
  }
  out.max_tokens = *max_completion > 0 ? *max_completion : *max_tokens;
  sp.set_logprobs(*logprobs);
  sp.set_top_logprobs(static_cast<int32_t>(*top_logprobs));
  out.sampling = sp;
  return out;
}

std::string OpenAiParam(std::string_view field) {
  if (field.starts_with("sampling.")) field.remove_prefix(9);
  if (field == "prompt_token_ids") return "prompt";
  return std::string(field);
}

int HttpStatusOf(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
      return 400;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kCancelled:
      return 499;  // the client closed the request (nginx's code): nobody reads it
    case absl::StatusCode::kUnimplemented:
      return 501;
    case absl::StatusCode::kUnavailable:
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    default:
      return 500;
  }
}

ApiError ToApiError(const absl::Status& status) {
  ApiError e;
  e.http_status = HttpStatusOf(status.code());
  std::string type = "server_error";
  std::string code;
  switch (e.http_status) {
    case 400:
      type = "invalid_request_error";
      break;
    case 401:
      type = "authentication_error";
      code = "invalid_api_key";
      break;
    case 403:
      type = "permission_error";
      break;
    case 404:
      type = "invalid_request_error";
      code = FieldOf(status) == "model" ? "model_not_found" : "not_found";
      break;
    case 429:
      type = "rate_limit_error";
      code = "rate_limit_exceeded";
      break;
    case 503:
      type = "service_unavailable_error";
      break;
    default:
      break;
  }
  const std::string field = FieldOf(status);
  using ordered = nlohmann::ordered_json;
  // The router's messages name tandem.v1 fields; say them in the OpenAI API's terms.
  const std::string message = absl::StrReplaceAll(
      status.message(), {{"sampling.", ""}, {"prompt_token_ids", "prompt"}});
  ordered err = {{"message", message},
              {"type", type},
                 {"param", field.empty() ? ordered(nullptr) : ordered(OpenAiParam(field))},
                 {"code", code.empty() ? ordered(nullptr) : ordered(code)}};
  e.body = ordered{{"error", std::move(err)}}.dump(-1, ' ', false,
                                                   ordered::error_handler_t::replace);
  return e;
}

std::string NewCompletionId() {
  thread_local std::mt19937_64 rng(std::random_device{}());
  return absl::StrFormat("cmpl-%016x%08x", rng(), static_cast<uint32_t>(rng()));
}


}  // namespace tandem::router
