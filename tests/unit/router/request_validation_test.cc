// Every malformed request named in the issue is INVALID_ARGUMENT with a message naming the
// field; good requests come back as token ids.
#include "router/request_validation.h"

#include <gtest/gtest.h>

#include "tests/unit/tokenizer/test_tokenizers.h"

namespace tandem::router {
namespace {

class RequestValidationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tokenizer_ =
        tokenizer::Tokenizer::FromJson(tokenizer::testing::ByteLevelJson().dump(), "").value();
    request_.mutable_sampling()->set_max_tokens(8);
  }

  absl::Status Check() {
    absl::Status s = ValidateSampling(request_.sampling(), limits_);
    if (!s.ok()) return s;
    return PromptTokens(request_, tokenizer_.get(), limits_).status();
  }

  void ExpectInvalid(const std::string& words) {
    const absl::Status s = Check();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find(words), std::string_view::npos) << s.message();
  }

  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  ModelLimits limits_{.context_length = 64, .vocab_size = 302};
  tandem::v1::GenerateRequest request_;
};

TEST_F(RequestValidationTest, AcceptsTextAndIds) {
  request_.set_prompt("hello");
  auto ids = PromptTokens(request_, tokenizer_.get(), limits_);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_FALSE(ids->empty());
  request_.clear_prompt();
  request_.add_prompt_token_ids(5);
  request_.add_prompt_token_ids(301);
  EXPECT_EQ(PromptTokens(request_, tokenizer_.get(), limits_).value(),
            (std::vector<int32_t>{5, 301}));
}

TEST_F(RequestValidationTest, PromptForms) {
  ExpectInvalid("empty prompt");
  request_.set_prompt("hi");
  request_.add_prompt_token_ids(1);
  ExpectInvalid("exactly one of prompt and prompt_token_ids");
  request_.clear_prompt_token_ids();
  EXPECT_EQ(PromptTokens(request_, nullptr, limits_).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(RequestValidationTest, InvalidUtf8) {
  request_.set_prompt(std::string("ok \xC3\x28 bad", 8));
  ExpectInvalid("UTF-8");
}

TEST_F(RequestValidationTest, IdsOutsideTheVocabulary) {
  request_.add_prompt_token_ids(1);
  request_.add_prompt_token_ids(302);
  ExpectInvalid("prompt_token_ids[1] = 302");
  request_.set_prompt_token_ids(1, -1);
  ExpectInvalid("prompt_token_ids[1] = -1");
}

TEST_F(RequestValidationTest, MaxTokensAndContext) {
  request_.add_prompt_token_ids(1);
  request_.mutable_sampling()->set_max_tokens(0);
  ExpectInvalid("max_tokens");
  request_.mutable_sampling()->set_max_tokens(-3);
  ExpectInvalid("max_tokens");
  request_.mutable_sampling()->set_max_tokens(64);  // 1 + 64 > 64
  ExpectInvalid("exceeds the context length 64");
  request_.mutable_sampling()->set_max_tokens(63);
  EXPECT_TRUE(Check().ok());
  for (int i = 0; i < 70; ++i) request_.add_prompt_token_ids(2);
  request_.mutable_sampling()->set_max_tokens(1);
  ExpectInvalid("context length is 64");
}

TEST_F(RequestValidationTest, SamplingRanges) {
  request_.add_prompt_token_ids(1);
  request_.mutable_sampling()->set_temperature(-0.5f);
  ExpectInvalid("temperature");
  request_.mutable_sampling()->set_temperature(0.7f);
  request_.mutable_sampling()->set_top_p(1.5f);
  ExpectInvalid("top_p");
  request_.mutable_sampling()->set_top_p(-0.1f);
  ExpectInvalid("top_p");
  request_.mutable_sampling()->set_top_p(1.0f);
  request_.mutable_sampling()->set_top_k(-1);
  ExpectInvalid("top_k");
  request_.mutable_sampling()->set_top_k(0);
  request_.mutable_sampling()->add_stop("");
  ExpectInvalid("sampling.stop[0]");
  request_.mutable_sampling()->clear_stop();
  EXPECT_TRUE(Check().ok());
  request_.mutable_sampling()->set_presence_penalty(2.5f);
  ExpectInvalid("presence_penalty");
  request_.mutable_sampling()->set_presence_penalty(-2.0f);
  request_.mutable_sampling()->set_frequency_penalty(-2.1f);
  ExpectInvalid("frequency_penalty");
  request_.mutable_sampling()->set_frequency_penalty(2.0f);
  request_.mutable_sampling()->set_repetition_penalty(-1.0f);
  ExpectInvalid("repetition_penalty");
  request_.mutable_sampling()->set_repetition_penalty(0.0f);  // off
  request_.mutable_sampling()->set_top_logprobs(3);
  ExpectInvalid("top_logprobs needs sampling.logprobs");
  request_.mutable_sampling()->set_logprobs(true);
  request_.mutable_sampling()->set_top_logprobs(21);
  ExpectInvalid("top_logprobs");
  request_.mutable_sampling()->set_top_logprobs(20);
  EXPECT_TRUE(Check().ok());
  EXPECT_EQ(FieldOf(ValidateSampling([] {
              tandem::v1::SamplingParams p;
              p.set_max_tokens(1);
              p.set_top_logprobs(-1);
              return p;
            }())),
            "sampling.top_logprobs");
}

// The operator's limits (router.max_*): each refusal names the field and the limit's key.
TEST_F(RequestValidationTest, ConfiguredLimitsAreRefusedNamingFieldAndLimit) {
  limits_ = {.context_length = 64,
             .vocab_size = 302,
             .max_prompt_tokens = 4,
             .max_tokens = 10,
             .max_stop_strings = 2,
             .max_stop_bytes = 3,
             .max_logprobs = 2};
  const auto expect = [&](const std::string& field, const std::string& words) {
    const absl::Status s = Check();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_EQ(FieldOf(s), field) << s;
    EXPECT_NE(s.message().find(words), std::string_view::npos) << s.message();
  };
  request_.add_prompt_token_ids(1);
  EXPECT_TRUE(Check().ok());
  for (int i = 0; i < 4; ++i) request_.add_prompt_token_ids(2);
  expect("prompt_token_ids", "5 tokens; this server's limit is 4 (router.max_prompt_tokens)");
  request_.clear_prompt_token_ids();
  request_.set_prompt("a b c d e f");
  expect("prompt", "router.max_prompt_tokens");
  request_.set_prompt("ab");
  request_.mutable_sampling()->set_max_tokens(11);
  expect("sampling.max_tokens", "limit is 10 (router.max_tokens)");
  request_.mutable_sampling()->set_max_tokens(10);
  EXPECT_TRUE(Check().ok());
  for (const char* s : {"a", "b", "c"}) request_.mutable_sampling()->add_stop(s);
  expect("sampling.stop", "at most 2 strings (router.max_stop_strings)");
  request_.mutable_sampling()->clear_stop();
  request_.mutable_sampling()->add_stop("abcd");
  expect("sampling.stop", "1 to 3 bytes long (router.max_stop_bytes)");
  request_.mutable_sampling()->clear_stop();
  request_.mutable_sampling()->set_logprobs(true);
  request_.mutable_sampling()->set_top_logprobs(3);
  expect("sampling.top_logprobs", "[0, 2] (router.max_logprobs)");
  request_.mutable_sampling()->set_top_logprobs(2);
  EXPECT_TRUE(Check().ok());
}

}  // namespace
}  // namespace tandem::router

namespace tandem::router {
namespace {

grpc::ByteBuffer Serialize(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

TEST(ParseGenerateRequestTest, ReadsEveryFieldOfThePublicMessage) {
  tandem::v1::GenerateRequest r;
  r.set_request_id("id-1");
  r.set_prompt("héllo");
  r.add_prompt_token_ids(3);
  r.add_prompt_token_ids(-7);
  tandem::v1::SamplingParams* s = r.mutable_sampling();
  s->set_temperature(0.5f);
  s->set_top_p(0.9f);
  s->set_top_k(40);
  s->set_seed(1ull << 40);
  s->set_max_tokens(12);
  s->add_stop("\n\n");
  s->add_stop("。");
  s->set_ignore_eos(true);
  s->set_presence_penalty(0.25f);
  s->set_frequency_penalty(-1.0f);
  s->set_repetition_penalty(1.1f);
  s->set_logprobs(true);
  s->set_top_logprobs(4);
  s->set_prompt_logprobs(true);
  s->set_seeded(true);
  r.set_cache_salt("tenant");
  // Every field is set above: a field added to the public message must be added here and to
  // the router's wire copy.
  for (const google::protobuf::Message* m : {static_cast<google::protobuf::Message*>(&r),
                                             static_cast<google::protobuf::Message*>(s)}) {
    std::vector<const google::protobuf::FieldDescriptor*> set;
    m->GetReflection()->ListFields(*m, &set);
    EXPECT_EQ(set.size(), static_cast<size_t>(m->GetDescriptor()->field_count()))
        << m->GetDescriptor()->full_name();
  }
  auto parsed = ParseGenerateRequest(Serialize(r.SerializeAsString()));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->SerializeAsString(), r.SerializeAsString());
}

TEST(ParseGenerateRequestTest, InvalidUtf8AndGarbageAreInvalidArgument) {
  // Field 2 (prompt) holding "a\xC3(b", field 4 (sampling) holding max_tokens = 4.
  const std::string bad_prompt = std::string("\x12\x04" "a\xC3(b" "\x22\x02\x28\x04", 10);
  auto parsed = ParseGenerateRequest(Serialize(bad_prompt));
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(parsed.status().message().find("prompt"), std::string_view::npos);
  // sampling.stop[0] (field 6 inside field 4) = "\xFF".
  const std::string bad_stop = std::string("\x22\x03\x32\x01\xFF", 5);
  parsed = ParseGenerateRequest(Serialize(bad_stop));
  EXPECT_NE(parsed.status().message().find("sampling.stop[0]"), std::string_view::npos);
  parsed = ParseGenerateRequest(Serialize(std::string("\x12\x50" "short", 7)));
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem::router
