// libFuzzer target: chat templates. The fuzzed bytes are compiled as a template; whatever
// compiles is rendered with a small conversation under tight limits. Every input must load or
// be refused with InvalidArgument, and render or fail with InvalidArgument/ResourceExhausted:
// no crash, no hang, no stack overflow, no other error.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "common/chat/chat_template.h"

namespace {

const nlohmann::ordered_json& Context() {
  static const auto* context = new nlohmann::ordered_json(nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Hi \u00e9\u6587 \ud83d\ude00"},
      {"role": "assistant", "content": null, "tool_calls": [{"type": "function",
        "function": {"name": "f", "arguments": {"a": [1, 2.5, true, null]}}}]},
      {"role": "tool", "content": "{\"r\": 1}"},
      {"role": "user", "content": [{"type": "text", "text": "parts"}, {"type": "image"}]}
    ],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
      "properties": {"a": {"type": "array"}}}}}],
    "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>",
    "enable_thinking": false
  })"));
  return *context;
}

bool Allowed(const absl::Status& s) {
  return s.ok() || s.code() == absl::StatusCode::kInvalidArgument ||
         s.code() == absl::StatusCode::kResourceExhausted;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view source(reinterpret_cast<const char*>(data), size);
  tandem::chat::ChatTemplateOptions options;
  options.limits.max_output_bytes = 64 << 10;
  options.limits.max_loop_iterations = 20000;
  options.limits.max_memory_bytes = 16 << 20;
  options.limits.max_range = 1000;
  options.clock = [] { return absl::FromUnixSeconds(1722000896); };
  options.time_zone = absl::UTCTimeZone();
  auto tmpl = tandem::chat::ChatTemplate::Compile(source, options);
  if (!tmpl.ok()) {
    if (tmpl.status().code() != absl::StatusCode::kInvalidArgument) std::abort();
    return 0;
  }
  auto out = (*tmpl)->Render(Context());
  if (!Allowed(out.status())) std::abort();
  if (out.ok() && out->size() > options.limits.max_output_bytes) std::abort();
  return 0;
}
