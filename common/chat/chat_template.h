// Hugging Face chat templates: the Jinja template a model ships in tokenizer_config.json (or
// chat_template.jinja) that turns a list of messages into the model's prompt text. Rendered
// as transformers renders it (trim_blocks, lstrip_blocks, its tojson and raise_exception,
// strftime_now, loop controls, {% generation %}), with Python's value semantics.
//
// Supported: {{ }}, {% %}, {# #}, whitespace control, {% raw %}; if/elif/else; for with
// loop.*, else, `if` filters, unpacking, break/continue; set (names, tuples, ns.attr, blocks);
// macro (defaults, caller), call, filter and generation blocks; Jinja's operators, tests and
// filters (see jinja_filters.cc, jinja_tests.cc); str/list/dict methods (jinja_methods.cc);
// range, namespace, dict, raise_exception, strftime_now. Deliberate differences: attributes and
// items of undefined are undefined (not an error); list.append and friends work (transformers'
// immutable sandbox refuses them); str.upper()/lower() use simple case mappings.
//
// Unsupported constructs fail at Compile with InvalidArgument naming the construct and line
// ("chat template line 3: unsupported tag 'include'"), as do unknown filters and tests. Render
// is bounded by RenderLimits: ResourceExhausted past them. A template's raise_exception(msg)
// fails Render with InvalidArgument whose message is exactly msg.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/chat/render_limits.h"
#include "nlohmann/json.hpp"

namespace tandem::chat {

struct Stmt;

struct ChatTemplateOptions {
  std::string name = "chat template";  // prefixes error messages
  RenderLimits limits;
  // What strftime_now() reads; unset: the system clock in local time, as Python's
  // datetime.now() does.
  std::function<absl::Time()> clock;
  absl::TimeZone time_zone = absl::LocalTimeZone();
};

// A chat template, compiled once, rendered per request. Immutable after Compile, so Render
// may run concurrently from any number of threads.
class ChatTemplate {
 public:
  static absl::StatusOr<std::unique_ptr<ChatTemplate>> Compile(std::string_view source,
                                                               std::string name = "chat template");
  static absl::StatusOr<std::unique_ptr<ChatTemplate>> Compile(std::string_view source,
                                                               ChatTemplateOptions options);
  ~ChatTemplate();
  ChatTemplate(const ChatTemplate&) = delete;
  ChatTemplate& operator=(const ChatTemplate&) = delete;

  // `context` is a JSON object whose keys become template variables: messages,
  // add_generation_prompt, bos_token, eos_token, tools, and any chat_template_kwargs.
  absl::StatusOr<std::string> Render(const nlohmann::ordered_json& context) const;

  const std::string& source() const { return source_; }
  const std::string& name() const { return options_.name; }

 private:
  ChatTemplate(std::string source, ChatTemplateOptions options);

  std::string source_;
  ChatTemplateOptions options_;
  std::vector<std::unique_ptr<Stmt>> body_;
};

struct ChatTemplateConfig {
  std::unique_ptr<ChatTemplate> tmpl;
  std::string bos_token;  // "" when the config has none
  std::string eos_token;
};

// From a model's tokenizer_config.json text: its chat_template (a string, or the list form
// [{"name": ..., "template": ...}] where "default" is chosen unless `name` is given) and
// bos_token/eos_token (strings or AddedToken objects {"content": ...}). NotFound when the
// config has no chat template.
absl::StatusOr<ChatTemplateConfig> LoadChatTemplate(std::string_view tokenizer_config_json,
                                                    std::string_view name = "");

// From a model directory: tokenizer_config.json for the tokens and, when present,
// chat_template.jinja (newer transformers save it separately), which takes precedence over the
// config's chat_template. With `name`, additional_chat_templates/<name>.jinja comes first.
absl::StatusOr<ChatTemplateConfig> LoadChatTemplateFromDir(const std::string& model_dir,
                                                           std::string_view name = "");

}  // namespace tandem::chat
