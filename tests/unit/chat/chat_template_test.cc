// The public API: loading a model's chat template from tokenizer_config.json or a model
// directory, and rendering conversations the way real chat templates are written.
#include "common/chat/chat_template.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/chat/chat_test_util.h"

namespace tandem::chat {
namespace {

using ::testing::HasSubstr;
using testing::Json;
using testing::Render;

// A llama-3.1 style template with a system prompt, tools and a generation prompt.
constexpr char kTemplate[] = R"({{- bos_token }}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] | trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if tools is not none and tools | length > 0 %}
    {{- "Tools:\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=1) }}
        {{- "\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {%- if not (message.role in ['user', 'assistant']) %}
        {{- raise_exception('Unknown role ' ~ message.role) }}
    {%- endif %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
)";

TEST(ChatTemplateTest, RendersAConversation) {
  auto tmpl = ChatTemplate::Compile(kTemplate);
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();
  Json ctx = {{"bos_token", "<|begin_of_text|>"},
              {"tools", nullptr},
              {"add_generation_prompt", true},
              {"messages",
               {{{"role", "system"}, {"content", " Be brief. "}},
                {{"role", "user"}, {"content", "Hi 👋\n"}},
                {{"role", "assistant"}, {"content", "Hello!"}},
                {{"role", "user"}, {"content", "日本語?"}}}}};
  auto out = (*tmpl)->Render(ctx);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out,
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi 👋<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\n日本語?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");

  ctx["tools"] = {{{"name", "f"}, {"parameters", {{"type", "object"}}}}};
  ctx["messages"] = {{{"role", "user"}, {"content", "x"}}};
  ctx["add_generation_prompt"] = false;
  out = (*tmpl)->Render(ctx);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out,
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nTools:\n{\n "
            "\"name\": \"f\",\n \"parameters\": {\n  \"type\": \"object\"\n }\n}\n<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nx<|eot_id|>");

  ctx["messages"] = {{{"role", "tool"}, {"content", "x"}}};
  EXPECT_EQ((*tmpl)->Render(ctx).status().message(), "Unknown role tool");
}

TEST(ChatTemplateTest, LoadsStringTemplateAndTokens) {
  auto config = LoadChatTemplate(R"({"chat_template": "{{ bos_token }}{{ messages[0].content }}",
      "bos_token": "<s>", "eos_token": {"__type": "AddedToken", "content": "</s>"}})");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->bos_token, "<s>");
  EXPECT_EQ(config->eos_token, "</s>");
  auto out = config->tmpl->Render({{"bos_token", "<s>"}, {"messages", {{{"content", "hi"}}}}});
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(*out, "<s>hi");
}

TEST(ChatTemplateTest, LoadsNamedTemplatesFromTheListForm) {
  const char* config = R"({"chat_template": [
      {"name": "default", "template": "D"}, {"name": "tool_use", "template": "T"}],
      "bos_token": null})";
  auto def = LoadChatTemplate(config);
  ASSERT_TRUE(def.ok()) << def.status();
  EXPECT_EQ(def->tmpl->source(), "D");
  EXPECT_EQ(def->bos_token, "");
  auto tool = LoadChatTemplate(config, "tool_use");
  ASSERT_TRUE(tool.ok()) << tool.status();
  EXPECT_EQ(tool->tmpl->source(), "T");
  EXPECT_EQ(LoadChatTemplate(config, "rag").status().code(), absl::StatusCode::kNotFound);
  auto no_default = LoadChatTemplate(R"({"chat_template": [{"name": "a", "template": "A"}]})");
  EXPECT_EQ(no_default.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(no_default.status().message()), HasSubstr("none named 'default'"));
}

TEST(ChatTemplateTest, LoadErrors) {
  EXPECT_EQ(LoadChatTemplate(R"({"bos_token": "<s>"})").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(LoadChatTemplate(R"({"chat_template": null})").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(LoadChatTemplate("{not json").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadChatTemplate(R"({"chat_template": 5})").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadChatTemplate(R"({"chat_template": "{% include 'x' %}"})").status().message(),
            "chat template line 1: unsupported tag 'include'");
}

class ChatTemplateDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Unique per test and process: ctest runs each test case as its own process, in parallel.
    dir_ =
        std::filesystem::path(::testing::TempDir()) /
        absl::StrCat("chat_dir_", ::testing::UnitTest::GetInstance()->current_test_info()->name(),
                     "_", getpid());
    std::filesystem::create_directories(dir_ / "additional_chat_templates");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void Write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name) << text;
  }
  std::filesystem::path dir_;
};

TEST_F(ChatTemplateDirTest, JinjaFileTakesPrecedence) {
  Write("tokenizer_config.json", R"({"chat_template": "config", "eos_token": "</s>"})");
  auto from_config = LoadChatTemplateFromDir(dir_.string());
  ASSERT_TRUE(from_config.ok()) << from_config.status();
  EXPECT_EQ(from_config->tmpl->source(), "config");

  Write("chat_template.jinja", "jinja {{ eos_token }}\n");
  Write("additional_chat_templates/tool_use.jinja", "tools");
  auto from_jinja = LoadChatTemplateFromDir(dir_.string());
  ASSERT_TRUE(from_jinja.ok()) << from_jinja.status();
  EXPECT_EQ(from_jinja->eos_token, "</s>");
  auto out = from_jinja->tmpl->Render({{"eos_token", from_jinja->eos_token}});
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(*out, "jinja </s>");
  auto named = LoadChatTemplateFromDir(dir_.string(), "tool_use");
  ASSERT_TRUE(named.ok()) << named.status();
  EXPECT_EQ(named->tmpl->source(), "tools");
}

TEST_F(ChatTemplateDirTest, MissingTemplate) {
  EXPECT_EQ(LoadChatTemplateFromDir(dir_.string()).status().code(), absl::StatusCode::kNotFound);
  Write("tokenizer_config.json", R"({"eos_token": "</s>"})");
  EXPECT_EQ(LoadChatTemplateFromDir(dir_.string()).status().code(), absl::StatusCode::kNotFound);
  Write("chat_template.jinja", "{% if %}");
  auto bad = LoadChatTemplateFromDir(dir_.string());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("chat_template.jinja line 1"));
}

}  // namespace
}  // namespace tandem::chat
