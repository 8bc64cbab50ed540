// Helpers for the chat template tests: render a template string with a JSON context.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "common/chat/chat_template.h"
#include "gtest/gtest.h"

namespace tandem::chat::testing {

using Json = nlohmann::ordered_json;

// Renders `source` with `context`; the error text when compiling or rendering fails.
inline std::string Render(std::string_view source, const Json& context = Json::object(),
                          ChatTemplateOptions options = {}) {
  auto tmpl = ChatTemplate::Compile(source, std::move(options));
  if (!tmpl.ok()) return "COMPILE ERROR: " + tmpl.status().ToString();
  auto out = (*tmpl)->Render(context);
  if (!out.ok()) return "RENDER ERROR: " + out.status().ToString();
  return *out;
}

// The status of compiling, then rendering, `source`.
inline absl::Status RenderStatus(std::string_view source, const Json& context = Json::object(),
                                 ChatTemplateOptions options = {}) {
  auto tmpl = ChatTemplate::Compile(source, std::move(options));
  if (!tmpl.ok()) return tmpl.status();
  return (*tmpl)->Render(context).status();
}

inline absl::Status CompileStatus(std::string_view source) {
  return ChatTemplate::Compile(source).status();
}

}  // namespace tandem::chat::testing
