#include "router/http/openai_protocol.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "router/request_validation.h"

namespace tandem::router {
namespace {

const OpenAiLimits kLimits{.model_name = "m", .context_length = 2048, .max_n = 4,
                           .max_prompts = 3, .max_choices = 8};

absl::StatusOr<CompletionRequest> Parse(const std::string& body) {
  return ParseCompletionRequest(body, kLimits);
}

// The OpenAI param an error names (empty when none).
std::string ParamOf(const absl::Status& s) { return OpenAiParam(FieldOf(s)); }

TEST(OpenAiProtocolTest, AbsentFieldsTakeTheOpenAiDefaults) {
  CompletionRequest r = Parse(R"({"prompt": "hi"})").value();
  ASSERT_EQ(r.prompts.size(), 1u);
  const tandem::v1::SamplingParams& s = r.prompts[0].sampling();
  EXPECT_EQ(r.prompts[0].prompt(), "hi");
  EXPECT_EQ(s.max_tokens(), 16);
  EXPECT_FLOAT_EQ(s.temperature(), 1.0f);  // not tandem.v1's 0 (greedy)
  EXPECT_FLOAT_EQ(s.top_p(), 1.0f);
  EXPECT_EQ(s.top_k(), 0);
  EXPECT_EQ(s.seed(), 0u);
  EXPECT_FALSE(s.seeded());  // a random seed
  EXPECT_FALSE(r.echo);
  EXPECT_FALSE(s.prompt_logprobs());
  EXPECT_EQ(r.n, 1);
  EXPECT_FALSE(r.stream);
  EXPECT_EQ(r.model, "m");
  // null reads as absent.
  EXPECT_EQ(Parse(R"({"prompt": "hi", "max_tokens": null, "stop": null})")
                ->prompts[0].sampling().max_tokens(),
            16);
}

TEST(OpenAiProtocolTest, TokenizeTakesAPromptOrAConversation) {
  const OpenAiLimits limits{.model_name = "m", .context_length = 64};
  TokenizeRequest text = ParseTokenizeRequest(R"({"prompt": "hi"})", limits).value();
  EXPECT_EQ(text.prompt, "hi");
  EXPECT_TRUE(text.add_special_tokens);
  EXPECT_FALSE(text.chat.has_value());
  TokenizeRequest chat =
      ParseTokenizeRequest(R"({"messages": [{"role": "assistant", "content": "x"}],
                              "continue_final_message": true,
                              "chat_template_kwargs": {"k": 1}})",
                           limits)
          .value();
  ASSERT_TRUE(chat.chat.has_value());
  EXPECT_FALSE(chat.add_special_tokens);  // the template places them
  EXPECT_EQ(chat.chat->messages.size(), 1u);
  EXPECT_TRUE(chat.chat->continue_final_message);
  EXPECT_FALSE(chat.chat->add_generation_prompt);
  EXPECT_EQ(chat.chat->template_kwargs["k"], 1);
  for (const auto& [body, param] : std::vector<std::pair<std::string, std::string>>{
           {R"({"messages": [{"role": "user", "content": "x"}], "prompt": "y"})", "prompt"},
           {R"({})", "prompt"},
           {R"({"prompt": 5})", "prompt"},
           {R"({"messages": []})", "messages"},
           {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{}]})", "tools"},
           {R"({"prompt": "x", "max_tokens": 3})", "max_tokens"}}) {
    absl::StatusOr<TokenizeRequest> r = ParseTokenizeRequest(body, limits);
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << body;
    EXPECT_EQ(ParamOf(r.status()), param) << body << ": " << r.status();
  }
}

TEST(OpenAiProtocolTest, EverySupportedFieldReachesTheRequest) {
  CompletionRequest r =
      Parse(R"({"model": "m", "prompt": [1, 2, 3], "max_tokens": 7, "temperature": 0.5,
                "top_p": 0.9, "top_k": 40, "seed": -3, "stop": ["a", "bc"], "n": 2,
                "ignore_eos": true, "stream": true, "stream_options": {"include_usage": true},
                "user": "u1", "echo": false, "logprobs": 3, "presence_penalty": 0.5,
                "frequency_penalty": -0.25, "repetition_penalty": 1.5, "best_of": 1,
                "logit_bias": {}, "suffix": ""})")
          .value();
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(std::vector<int32_t>(r.prompts[0].prompt_token_ids().begin(),
                                 r.prompts[0].prompt_token_ids().end()),
            (std::vector<int32_t>{1, 2, 3}));
  const tandem::v1::SamplingParams& s = r.prompts[0].sampling();
  EXPECT_EQ(s.max_tokens(), 7);
  EXPECT_FLOAT_EQ(s.temperature(), 0.5f);
  EXPECT_FLOAT_EQ(s.top_p(), 0.9f);
  EXPECT_EQ(s.top_k(), 40);
  EXPECT_EQ(s.seed(), static_cast<uint64_t>(int64_t{-3}));
  ASSERT_EQ(s.stop_size(), 2);
  EXPECT_EQ(s.stop(1), "bc");
  EXPECT_TRUE(s.ignore_eos());
  EXPECT_FLOAT_EQ(s.presence_penalty(), 0.5f);
  EXPECT_FLOAT_EQ(s.frequency_penalty(), -0.25f);
  EXPECT_FLOAT_EQ(s.repetition_penalty(), 1.5f);
  EXPECT_TRUE(s.logprobs());
  EXPECT_EQ(s.top_logprobs(), 3);
  EXPECT_EQ(r.n, 2);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_EQ(r.user, "u1");
  EXPECT_TRUE(s.seeded());
  EXPECT_EQ(Parse(R"({"prompt": "x", "top_k": -1})")->prompts[0].sampling().top_k(), 0);
  // seed 0 is a seed (OpenAI's), not tandem.v1's "random".
  EXPECT_TRUE(Parse(R"({"prompt": "x", "seed": 0})")->prompts[0].sampling().seeded());
  EXPECT_FALSE(Parse(R"({"prompt": "x", "seed": null})")->prompts[0].sampling().seeded());
  // echo: the prompt text leads each choice; with logprobs the prompt's are asked for too;
  // max_tokens 0 (echo only) generates one token the door drops.
  CompletionRequest echo = Parse(R"({"prompt": ["ab", "cd"], "echo": true})").value();
  EXPECT_TRUE(echo.echo);
  EXPECT_EQ(echo.prompt_texts, (std::vector<std::string>{"ab", "cd"}));
  EXPECT_FALSE(echo.prompts[0].sampling().prompt_logprobs());
  CompletionRequest score =
      Parse(R"({"prompt": "ab", "echo": true, "max_tokens": 0, "logprobs": 2})").value();
  EXPECT_TRUE(score.generate_none);
  EXPECT_EQ(score.prompts[0].sampling().max_tokens(), 1);
  EXPECT_TRUE(score.prompts[0].sampling().prompt_logprobs());
  EXPECT_EQ(score.prompts[0].sampling().top_logprobs(), 2);
  // logprobs: null is off, 0 the sampled token's alone.
  EXPECT_FALSE(Parse(R"({"prompt": "x", "logprobs": null})")->prompts[0].sampling().logprobs());
  EXPECT_TRUE(Parse(R"({"prompt": "x", "logprobs": 0})")->prompts[0].sampling().logprobs());
  EXPECT_EQ(Parse(R"({"prompt": "x", "logprobs": 0})")->prompts[0].sampling().top_logprobs(), 0);
  EXPECT_FLOAT_EQ(Parse(R"({"prompt": "x"})")->prompts[0].sampling().repetition_penalty(), 1.0f);
  EXPECT_EQ(Parse(R"({"prompt": "x", "max_tokens": 16.0})")->prompts[0].sampling().max_tokens(),
            16);
  EXPECT_EQ(Parse(R"({"prompt": "x", "stop": "end"})")->prompts[0].sampling().stop(0), "end");
}

TEST(OpenAiProtocolTest, SeveralPromptsInOneRequest) {
  CompletionRequest r = Parse(R"({"prompt": ["a", [5, 6]], "max_tokens": 3})").value();
  ASSERT_EQ(r.prompts.size(), 2u);
  EXPECT_EQ(r.prompts[0].prompt(), "a");
  EXPECT_EQ(r.prompts[1].prompt_token_ids_size(), 2);
  EXPECT_EQ(r.prompts[1].sampling().max_tokens(), 3);
  EXPECT_EQ(ParamOf(Parse(R"({"prompt": ["a", "b", "c", "d"]})").status()), "prompt");
  EXPECT_EQ(ParamOf(Parse(R"({"prompt": ["a", "b", "c"], "n": 3})").status()), "n");
}

TEST(OpenAiProtocolTest, BadRequestsNameTheirField) {
  struct Case {
    const char* body;
    absl::StatusCode code;
    const char* param;
  };
  const Case cases[] = {
      {R"({"prompt": 5})", absl::StatusCode::kInvalidArgument, "prompt"},
      {R"({})", absl::StatusCode::kInvalidArgument, "prompt"},
      {R"({"prompt": ""})", absl::StatusCode::kInvalidArgument, "prompt"},
      {R"({"prompt": []})", absl::StatusCode::kInvalidArgument, "prompt"},
      {R"({"prompt": [1, 2.5]})", absl::StatusCode::kInvalidArgument, "prompt"},
      {R"({"prompt": [1, 99999999999]})", absl::StatusCode::kInvalidArgument, "prompt"},
      {R"({"prompt": "x", "max_tokens": 0})", absl::StatusCode::kInvalidArgument, "max_tokens"},
      {R"({"prompt": "x", "max_tokens": 1e30})", absl::StatusCode::kInvalidArgument, "max_tokens"},
      {R"({"prompt": "x", "max_tokens": 2.5})", absl::StatusCode::kInvalidArgument, "max_tokens"},
      {R"({"prompt": "x", "max_tokens": "8"})", absl::StatusCode::kInvalidArgument, "max_tokens"},
      {R"({"prompt": "x", "temperature": "hot"})", absl::StatusCode::kInvalidArgument,
       "temperature"},
      {R"({"prompt": "x", "top_k": -2})", absl::StatusCode::kInvalidArgument, "top_k"},
      {R"({"prompt": "x", "seed": 1.5})", absl::StatusCode::kInvalidArgument, "seed"},
      {R"({"prompt": "x", "stop": [1]})", absl::StatusCode::kInvalidArgument, "stop"},
      {R"({"prompt": "x", "n": 0})", absl::StatusCode::kInvalidArgument, "n"},
      {R"({"prompt": "x", "n": 5})", absl::StatusCode::kInvalidArgument, "n"},
      {R"({"prompt": "x", "stream": "yes"})", absl::StatusCode::kInvalidArgument, "stream"},
      {R"({"prompt": "x", "stream_options": {"include_usage": true}})",
       absl::StatusCode::kInvalidArgument, "stream_options"},
      {R"({"prompt": "x", "stream": true, "stream_options": {"other": 1}})",
       absl::StatusCode::kInvalidArgument, "stream_options"},
      {R"({"prompt": "x", "logprobs": 21})", absl::StatusCode::kInvalidArgument, "logprobs"},
      {R"({"prompt": "x", "logprobs": true})", absl::StatusCode::kInvalidArgument, "logprobs"},
      {R"({"prompt": "x", "echo": 1})", absl::StatusCode::kInvalidArgument, "echo"},
      {R"({"prompt": "x", "max_tokens": 0})", absl::StatusCode::kInvalidArgument, "max_tokens"},
      {R"({"prompt": "x", "presence_penalty": "high"})", absl::StatusCode::kInvalidArgument,
       "presence_penalty"},
      {R"({"prompt": "x", "repetition_penalty": 0})", absl::StatusCode::kInvalidArgument,
       "repetition_penalty"},
      {R"({"prompt": "x", "best_of": 2})", absl::StatusCode::kInvalidArgument, "best_of"},
      {R"({"prompt": "x", "logit_bias": {"1": 5}})", absl::StatusCode::kInvalidArgument,
       "logit_bias"},
      {R"({"prompt": "x", "tools": []})", absl::StatusCode::kInvalidArgument, "tools"},
      {R"({"prompt": "x", "model": "other"})", absl::StatusCode::kNotFound, "model"},
      {R"({"prompt": "x", "model": 3})", absl::StatusCode::kInvalidArgument, "model"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<CompletionRequest> r = Parse(c.body);
    ASSERT_FALSE(r.ok()) << c.body;
    EXPECT_EQ(r.status().code(), c.code) << c.body << ": " << r.status();
    EXPECT_EQ(ParamOf(r.status()), c.param) << c.body << ": " << r.status();
    EXPECT_FALSE(r.status().message().empty());
  }
  for (const char* body : {"", "{", "[1]", "\"x\"", "{\"prompt\": \"x\"} trailing"}) {
    absl::StatusOr<CompletionRequest> r = Parse(body);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << body;
    EXPECT_EQ(ParamOf(r.status()), "") << body;
  }
}

TEST(OpenAiProtocolTest, ErrorBodiesHaveOpenAisShape) {
  const ApiError e = ToApiError(InvalidField("sampling.max_tokens", "too many"));
  EXPECT_EQ(e.http_status, 400);
  const nlohmann::json body = nlohmann::json::parse(e.body);
  EXPECT_EQ(body["error"]["message"], "too many");
  EXPECT_EQ(body["error"]["type"], "invalid_request_error");
  EXPECT_EQ(body["error"]["param"], "max_tokens");
  EXPECT_TRUE(body["error"]["code"].is_null());
  EXPECT_EQ(ToApiError(absl::ResourceExhaustedError("queue full")).http_status, 429);
  EXPECT_EQ(ToApiError(absl::UnavailableError("no worker")).http_status, 503);
  EXPECT_EQ(ToApiError(absl::DeadlineExceededError("late")).http_status, 504);
  EXPECT_EQ(ToApiError(absl::InternalError("bug")).http_status, 500);
  const ApiError model = ToApiError(Parse(R"({"prompt": "x", "model": "gpt"})").status());
  EXPECT_EQ(model.http_status, 404);
  EXPECT_EQ(nlohmann::json::parse(model.body)["error"]["code"], "model_not_found");
  EXPECT_EQ(OpenAiParam("prompt_token_ids"), "prompt");
}

TEST(OpenAiProtocolTest, TokenizeAndDetokenizeRequests) {
  TokenizeRequest t = ParseTokenizeRequest(R"({"prompt": "hi", "add_special_tokens": false})",
                                           kLimits)
                          .value();
  EXPECT_EQ(t.prompt, "hi");
  EXPECT_FALSE(t.add_special_tokens);
  EXPECT_FALSE(ParseTokenizeRequest(R"({"prompt": 1})", kLimits).ok());
  EXPECT_FALSE(ParseTokenizeRequest(R"({"prompt": "x", "extra": 1})", kLimits).ok());
  EXPECT_EQ(ParseDetokenizeRequest(R"({"tokens": [3, 4]})", kLimits).value(),
            (std::vector<int32_t>{3, 4}));
  EXPECT_FALSE(ParseDetokenizeRequest(R"({"tokens": [-1]})", kLimits).ok());
  EXPECT_FALSE(ParseDetokenizeRequest(R"({"tokens": "1"})", kLimits).ok());
  EXPECT_EQ(ParseDetokenizeRequest(R"({"tokens": [1], "model": "z"})", kLimits).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(OpenAiProtocolTest, CompletionIdsAreUnique) {
  const std::string a = NewCompletionId(), b = NewCompletionId();
  EXPECT_EQ(a.rfind("cmpl-", 0), 0u);
  EXPECT_EQ(a.size(), 5u + 24u);
  EXPECT_NE(a, b);
}

}  // namespace
}  // namespace tandem::router

namespace tandem::router {
namespace {

absl::StatusOr<ChatRequest> ParseChat(const std::string& body) {
  return ParseChatRequest(body, kLimits);
}

TEST(OpenAiChatProtocolTest, MessagesAndChatFields) {
  ChatRequest r =
      ParseChat(R"({"model": "m", "messages": [
                      {"role": "system", "content": "be brief"},
                      {"role": "user", "content": [{"type": "text", "text": "a"},
                                                    {"type": "text", "text": "b"}], "name": "u"},
                      {"role": "assistant", "content": null}],
                    "max_completion_tokens": 9, "max_tokens": 5, "logprobs": true,
                    "top_logprobs": 4, "temperature": 0, "stream": true,
                    "stream_options": {"include_usage": true}, "n": 2, "seed": 3,
                    "chat_template_kwargs": {"enable_thinking": false},
                    "tools": [], "tool_choice": "none", "response_format": {"type": "text"}})")
          .value();
  ASSERT_EQ(r.messages.size(), 3u);
  EXPECT_EQ(r.messages[1]["content"], "a\nb");  // text parts joined
  EXPECT_EQ(r.messages[1]["name"], "u");
  EXPECT_EQ(r.messages[2]["content"], "");
  EXPECT_EQ(r.max_tokens, 9);  // max_completion_tokens wins over max_tokens
  EXPECT_TRUE(r.sampling.logprobs());
  EXPECT_EQ(r.sampling.top_logprobs(), 4);
  EXPECT_FLOAT_EQ(r.sampling.temperature(), 0.0f);
  EXPECT_EQ(r.completion.n, 2);
  EXPECT_TRUE(r.completion.stream && r.completion.include_usage);
  EXPECT_EQ(r.template_kwargs["enable_thinking"], false);
  EXPECT_TRUE(r.add_generation_prompt);
  EXPECT_FALSE(r.continue_final_message);
  // Defaults: no max_tokens (the door fills the context), no logprobs.
  ChatRequest d = ParseChat(R"({"messages": [{"role": "user", "content": "hi"}]})").value();
  EXPECT_EQ(d.max_tokens, 0);
  EXPECT_FALSE(d.sampling.logprobs());
  EXPECT_FLOAT_EQ(d.sampling.temperature(), 1.0f);
  // continue_final_message turns the generation prompt off.
  ChatRequest c = ParseChat(R"({"messages": [{"role": "user", "content": "x"},
                                             {"role": "assistant", "content": "def"}],
                                "continue_final_message": true})")
                      .value();
  EXPECT_FALSE(c.add_generation_prompt);
  EXPECT_TRUE(c.continue_final_message);
}

TEST(OpenAiChatProtocolTest, BadChatRequestsNameTheirField) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({})", "messages"},
      {R"({"messages": []})", "messages"},
      {R"({"messages": "hi"})", "messages"},
      {R"({"messages": [{"role": "tool", "content": "x"}]})", "messages"},
      {R"({"messages": [{"role": "user"}, 3]})", "messages[1]"},
      {R"({"messages": [{"role": "user", "content": 5}]})", "messages[0].content"},
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})",
       "messages[0].content"},
      {R"({"messages": [{"role": "user", "content": "x", "tool_calls": [{}]}]})", "messages"},
      {R"({"messages": [{"role": "user", "content": "x", "weird": 1}]})", "messages"},
      {R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})", "top_logprobs"},
      {R"({"messages": [{"role": "user", "content": "x"}], "logprobs": 1})", "logprobs"},
      {R"({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0})",
       "max_completion_tokens"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]})",
       "tools"},
      {R"({"messages": [{"role": "user", "content": "x"}], "response_format":
           {"type": "json_object"}})",
       "response_format"},
      {R"({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": []})",
       "chat_template_kwargs"},
      {R"({"messages": [{"role": "user", "content": "x"}], "continue_final_message": true})",
       "continue_final_message"},
      {R"({"messages": [{"role": "assistant", "content": "x"}], "continue_final_message": true,
           "add_generation_prompt": true})",
       "continue_final_message"},
      {R"({"messages": [{"role": "user", "content": "x"}], "prompt": "y"})", "prompt"},
  };
  for (const auto& [body, param] : cases) {
    absl::StatusOr<ChatRequest> r = ParseChat(body);
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << body << r.status();
    EXPECT_EQ(ParamOf(r.status()), param) << body << ": " << r.status();
  }
}

}  // namespace
}  // namespace tandem::router
