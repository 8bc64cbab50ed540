// Bad tokenizer.json / tokenizer_config.json input: clear errors naming the file and key.
#include <filesystem>
#include <fstream>

#include "common/tokenizer/tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/tokenizer/test_tokenizers.h"

namespace tandem::tokenizer {
namespace {

using ::testing::AllOf;
using testing::ByteLevelJson;
using ::testing::HasSubstr;
using testing::SentencePieceJson;

absl::Status LoadError(const nlohmann::json& doc, const std::string& config = "") {
  return Tokenizer::FromJson(doc.dump(), config, "m/tokenizer.json").status();
}

TEST(TokenizerErrorsTest, BadJsonNamesFile) {
  auto s = Tokenizer::FromJson("{not json", "", "m/tokenizer.json").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("m/tokenizer.json"));
  EXPECT_FALSE(Tokenizer::FromJson("[1, 2]", "", "tokenizer.json").ok());
}

TEST(TokenizerErrorsTest, MissingFieldsNameKey) {
  auto doc = ByteLevelJson();
  doc.erase("model");
  EXPECT_THAT(std::string(LoadError(doc).message()), HasSubstr("\"model\""));
  for (const char* key : {"vocab", "merges"}) {
    doc = ByteLevelJson();
    doc["model"].erase(key);
    auto s = LoadError(doc);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.message()), AllOf(HasSubstr("m/tokenizer.json model"),
                                                HasSubstr(std::string("\"") + key + "\"")));
  }
}

TEST(TokenizerErrorsTest, BadValues) {
  auto doc = ByteLevelJson();
  doc["model"]["merges"].push_back("a b c");
  EXPECT_THAT(std::string(LoadError(doc).message()), HasSubstr("merges[8]"));
  doc = ByteLevelJson();
  doc["model"]["merges"].push_back("zz qq");
  EXPECT_THAT(std::string(LoadError(doc).message()), HasSubstr("not in the vocab"));
  doc = ByteLevelJson();
  doc["model"]["vocab"]["bad"] = "seven";
  EXPECT_THAT(std::string(LoadError(doc).message()), HasSubstr("\"bad\""));
  doc = ByteLevelJson();
  doc["added_tokens"][0].erase("id");
  EXPECT_THAT(std::string(LoadError(doc).message()),
              AllOf(HasSubstr("added_tokens[0]"), HasSubstr("\"id\"")));
  doc = SentencePieceJson();
  doc["model"]["unk_token"] = "<nope>";
  EXPECT_THAT(std::string(LoadError(doc).message()), HasSubstr("unk_token"));
  doc = ByteLevelJson();
  doc["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
  EXPECT_THAT(std::string(LoadError(doc).message()), HasSubstr("regex does not compile"));
}

TEST(TokenizerErrorsTest, UnknownTypesAreUnimplemented) {
  for (const char* field : {"normalizer", "pre_tokenizer", "decoder", "post_processor"}) {
    auto doc = ByteLevelJson();
    doc[field] = {{"type", "Bogus"}};
    auto s = LoadError(doc);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << field;
    EXPECT_THAT(std::string(s.message()), AllOf(HasSubstr(field), HasSubstr("\"Bogus\"")));
  }
  auto doc = ByteLevelJson();
  doc["model"]["type"] = "Unigram";
  EXPECT_EQ(LoadError(doc).code(), absl::StatusCode::kUnimplemented);
  doc = ByteLevelJson();
  doc["decoder"] = "ByteLevel";  // Not an object.
  EXPECT_EQ(LoadError(doc).code(), absl::StatusCode::kInvalidArgument);
}

TEST(TokenizerErrorsTest, BadConfig) {
  auto doc = ByteLevelJson();
  auto s = LoadError(doc, "{");
  EXPECT_THAT(std::string(s.message()), HasSubstr("m/tokenizer_config.json"));
  s = LoadError(doc, R"({"bos_token": "<missing>"})");
  EXPECT_THAT(std::string(s.message()), AllOf(HasSubstr("bos_token"), HasSubstr("<missing>")));
  s = LoadError(doc, R"({"bos_token": "<|bos|>", "add_bos_token": "yes"})");
  EXPECT_THAT(std::string(s.message()), HasSubstr("add_bos_token"));
}

TEST(TokenizerErrorsTest, LoadReadsDirectory) {
  std::string dir = ::testing::TempDir() + "/tok_load_test";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  EXPECT_EQ(Tokenizer::Load(dir).status().code(), absl::StatusCode::kNotFound);
  std::ofstream(dir + "/tokenizer.json") << ByteLevelJson().dump();
  std::ofstream(dir + "/tokenizer_config.json") << R"({"eos_token": "<|bos|>"})";
  auto t = Tokenizer::Load(dir);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->eos_id(), 300);
}

}  // namespace
}  // namespace tandem::tokenizer
