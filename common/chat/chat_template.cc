#include "common/chat/chat_template.h"

#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/chat/jinja_ast.h"
#include "common/chat/jinja_parser.h"
#include "common/chat/jinja_renderer.h"
#include "common/chat/jinja_scope.h"
#include "common/chat/render_state.h"
#include "common/util/file_util.h"

namespace tandem::chat {
namespace {

using Json = nlohmann::ordered_json;

absl::StatusOr<Value> FromJson(const Json& j, RenderState& state, int depth) {
  if (depth > state.limits().max_recursion_depth) {
    return absl::InvalidArgumentError("chat template context nested too deeply");
  }
  switch (j.type()) {
    case Json::value_t::null:
      return Value::None();
    case Json::value_t::boolean:
      return Value::Bool(j.get<bool>());
    case Json::value_t::number_integer:
      return Value::Integer(j.get<int64_t>());
    case Json::value_t::number_unsigned:
      return Value::Integer(j.get<uint64_t>());
    case Json::value_t::number_float:
      return Value::Float(j.get<double>());
    case Json::value_t::string:
      return state.heap().NewString(j.get_ref<const std::string&>());
    case Json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const Json& item : j) {
        auto v = FromJson(item, state, depth + 1);
        if (!v.ok()) return v;
        items.push_back(std::move(*v));
      }
      return state.heap().NewSequence(std::move(items));
    }
    case Json::value_t::object: {
      auto dict = state.heap().NewDict();
      if (!dict.ok()) return dict.status();
      if (auto s = state.heap().ChargeItems(j.size()); !s.ok()) return s;
      for (const auto& [key, item] : j.items()) {
        auto v = FromJson(item, state, depth + 1);
        if (!v.ok()) return v;
        (*dict)->SetString(key, std::move(*v));
      }
      return Value::DictOf(*dict);
    }
    default:
      return absl::InvalidArgumentError("chat template context holds a non-JSON value");
  }
}

// bos_token / eos_token: a string, or an AddedToken object {"content": ...}.
std::string TokenText(const Json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    auto content = it->find("content");
    if (content != it->end() && content->is_string()) return content->get<std::string>();
  }
  return "";
}

// The template source from the config's chat_template field.
absl::StatusOr<std::string> SelectTemplate(const Json& field, std::string_view name) {
  if (field.is_string()) {
    if (!name.empty() && name != "default") {
      return absl::NotFoundError(absl::StrCat("tokenizer_config.json has one chat_template, not '",
                                              std::string(name), "'"));
    }
    return field.get<std::string>();
  }
  if (!field.is_array()) {
    return absl::InvalidArgumentError(
        "tokenizer_config.json chat_template must be a string or a list of named templates");
  }
  std::string want = name.empty() ? "default" : std::string(name);
  std::vector<std::string> names;
  for (const Json& entry : field) {
    if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string() ||
        !entry.contains("template") || !entry["template"].is_string()) {
      return absl::InvalidArgumentError(
          "tokenizer_config.json chat_template entries must be {\"name\": ..., \"template\": ...}");
    }
    names.push_back(entry["name"].get<std::string>());
    if (names.back() == want) return entry["template"].get<std::string>();
  }
  if (name.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer_config.json has several chat templates and none named 'default': ",
                     absl::StrJoin(names, ", "), "; choose one by name"));
  }
  return absl::NotFoundError(absl::StrCat("tokenizer_config.json has no chat template named '",
                                          want, "' (it has ", absl::StrJoin(names, ", "), ")"));
}

absl::StatusOr<Json> ParseConfig(std::string_view text) {
  Json config = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded() || !config.is_object()) {
    return absl::InvalidArgumentError("tokenizer_config.json is not a JSON object");
  }
  return config;
}

}  // namespace

ChatTemplate::ChatTemplate(std::string source, ChatTemplateOptions options)
    : source_(std::move(source)), options_(std::move(options)) {}

ChatTemplate::~ChatTemplate() = default;

absl::StatusOr<std::unique_ptr<ChatTemplate>> ChatTemplate::Compile(std::string_view source,
                                                                    std::string name) {
  ChatTemplateOptions options;
  options.name = std::move(name);
  return Compile(source, std::move(options));
}

absl::StatusOr<std::unique_ptr<ChatTemplate>> ChatTemplate::Compile(std::string_view source,
                                                                    ChatTemplateOptions options) {
  try {
    auto body = Parser::Parse(source, options.name);
    if (!body.ok()) return body.status();
    std::unique_ptr<ChatTemplate> t(new ChatTemplate(std::string(source), std::move(options)));
    t->body_ = std::move(*body);
    return t;
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("compiling the chat template failed: ", e.what()));
  }
}

absl::StatusOr<std::string> ChatTemplate::Render(const nlohmann::ordered_json& context) const {
  if (!context.is_object()) {
    return absl::InvalidArgumentError("chat template context must be a JSON object");
  }
  try {
    RenderState state(options_.limits, options_.clock, options_.time_zone);
    Scope root(nullptr);
    for (const auto& [key, item] : context.items()) {
      auto v = FromJson(item, state, 1);
      if (!v.ok()) return v.status();
      root.Set(key, std::move(*v));
    }
    Renderer renderer(options_.name, state);
    return renderer.Render(body_, root);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("out of memory rendering the chat template");
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("rendering the chat template failed: ", e.what()));
  }
}

absl::StatusOr<ChatTemplateConfig> LoadChatTemplate(std::string_view tokenizer_config_json,
                                                    std::string_view name) {
  auto config = ParseConfig(tokenizer_config_json);
  if (!config.ok()) return config.status();
  auto field = config->find("chat_template");
  if (field == config->end() || field->is_null()) {
    return absl::NotFoundError("tokenizer_config.json has no chat_template");
  }
  auto source = SelectTemplate(*field, name);
  if (!source.ok()) return source.status();
  auto tmpl = ChatTemplate::Compile(*source);
  if (!tmpl.ok()) return tmpl.status();
  return ChatTemplateConfig{std::move(*tmpl), TokenText(*config, "bos_token"),
                            TokenText(*config, "eos_token")};
}

absl::StatusOr<ChatTemplateConfig> LoadChatTemplateFromDir(const std::string& model_dir,
                                                           std::string_view name) {
  std::string config_path = model_dir + "/tokenizer_config.json";
  Json config = Json::object();
  if (FileExists(config_path)) {
    auto text = ReadFileToString(config_path);
    if (!text.ok()) return text.status();
    auto parsed = ParseConfig(*text);
    if (!parsed.ok()) return parsed.status();
    config = std::move(*parsed);
  }
  std::vector<std::string> candidates;
  if (!name.empty()) {
    candidates.push_back(
        absl::StrCat(model_dir, "/additional_chat_templates/", std::string(name), ".jinja"));
  }
  if (name.empty() || name == "default") candidates.push_back(model_dir + "/chat_template.jinja");
  for (const std::string& path : candidates) {
    if (!FileExists(path)) continue;
    auto source = ReadFileToString(path);
    if (!source.ok()) return source.status();
    auto tmpl = ChatTemplate::Compile(*source, path);
    if (!tmpl.ok()) return tmpl.status();
    return ChatTemplateConfig{std::move(*tmpl), TokenText(config, "bos_token"),
                              TokenText(config, "eos_token")};
  }
  if (!FileExists(config_path)) {
    return absl::NotFoundError(
        absl::StrCat(model_dir, " has no chat_template.jinja and no tokenizer_config.json"));
  }
  return LoadChatTemplate(config.dump(), name);
}

}  // namespace tandem::chat
