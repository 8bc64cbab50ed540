// Normalizers, pre-tokenizers, decoders and added-token matching in isolation.
#include "common/tokenizer/added_tokens.h"
#include "common/tokenizer/decoder.h"
#include "common/tokenizer/normalizer.h"
#include "common/tokenizer/pre_tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::tokenizer {
namespace {

using nlohmann::json;
using ::testing::ElementsAre;

std::string Normalize(const json& j, const std::string& text) {
  auto n = ParseNormalizer(j, "n");
  EXPECT_TRUE(n.ok()) << n.status();
  return n.ok() ? (*n)->Normalize(text) : "<error>";
}

std::vector<std::string> PreTokenize(const json& j, const std::string& text, bool first = true) {
  auto p = ParsePreTokenizer(j, "p");
  EXPECT_TRUE(p.ok()) << p.status();
  std::vector<std::string> pieces = {text};
  if (p.ok()) (*p)->PreTokenize(&pieces, first);
  return pieces;
}

std::vector<std::string> Decode(const json& j, std::vector<std::string> tokens) {
  auto d = ParseDecoder(j, "d");
  EXPECT_TRUE(d.ok()) << d.status();
  if (d.ok()) (*d)->Decode(&tokens);
  return tokens;
}

TEST(NormalizerTest, UnicodeForms) {
  EXPECT_EQ(Normalize({{"type", "NFC"}}, "e\xCC\x81"), "\xC3\xA9");
  EXPECT_EQ(Normalize({{"type", "NFD"}}, "\xC3\xA9"), "e\xCC\x81");
  EXPECT_EQ(Normalize({{"type", "NFKC"}}, "\xEF\xAC\x81"), "fi");  // U+FB01 ligature
  EXPECT_EQ(Normalize({{"type", "Lowercase"}}, "ABC \xC3\x89"), "abc \xC3\xA9");
}

TEST(NormalizerTest, SequencePrependReplace) {
  json seq = {
      {"type", "Sequence"},
      {"normalizers",
       json::array({{{"type", "Prepend"}, {"prepend", "_"}},
                    {{"type", "Replace"}, {"pattern", {{"Regex", " +"}}}, {"content", "_"}}})}};
  EXPECT_EQ(Normalize(seq, "a  b c"), "_a_b_c");
  EXPECT_EQ(Normalize(seq, ""), "");  // Prepend leaves empty text empty.
  auto none = ParseNormalizer(nullptr, "n");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, nullptr);  // No normalizer: text passes through.
}

TEST(PreTokenizerTest, SplitBehaviors) {
  auto split = [](const char* behavior) {
    return json{{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", behavior}};
  };
  EXPECT_THAT(PreTokenize(split("Isolated"), "a-b--c"), ElementsAre("a", "-", "b", "-", "-", "c"));
  EXPECT_THAT(PreTokenize(split("Removed"), "a-b--c"), ElementsAre("a", "b", "c"));
  EXPECT_THAT(PreTokenize(split("MergedWithPrevious"), "a-b--c"),
              ElementsAre("a-", "b-", "-", "c"));
  EXPECT_THAT(PreTokenize(split("MergedWithNext"), "a-b--c"), ElementsAre("a", "-b", "-", "-c"));
  EXPECT_THAT(PreTokenize(split("Contiguous"), "a-b--c"), ElementsAre("a", "-", "b", "--", "c"));
  json inverted = split("Isolated");
  inverted["pattern"] = {{"Regex", "\\p{L}+"}};
  inverted["invert"] = true;
  EXPECT_THAT(PreTokenize(inverted, "ab, cd"), ElementsAre("ab", ", ", "cd"));
}

TEST(PreTokenizerTest, Metaspace) {
  json j = {{"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}, {"prepend_scheme", "first"}};
  EXPECT_THAT(PreTokenize(j, "hi there"), ElementsAre("\xE2\x96\x81hi", "\xE2\x96\x81there"));
  EXPECT_THAT(PreTokenize(j, "hi", /*first=*/false), ElementsAre("hi"));
  j["split"] = false;
  EXPECT_THAT(PreTokenize(j, "a b"), ElementsAre("\xE2\x96\x81"
                                                 "a\xE2\x96\x81"
                                                 "b"));
}

TEST(PreTokenizerTest, ByteLevelWithGpt2Regex) {
  json j = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}};
  EXPECT_THAT(PreTokenize(j, "Hi it's 42!"), ElementsAre("\xC4\xA0Hi", "\xC4\xA0it", "'s",
                                                         "\xC4\xA0"
                                                         "42",
                                                         "!"));
}

TEST(DecoderTest, MetaspaceStripAndByteFallback) {
  EXPECT_THAT(Decode({{"type", "Metaspace"}}, {"\xE2\x96\x81hi", "\xE2\x96\x81there"}),
              ElementsAre("hi", " there"));
  EXPECT_THAT(Decode({{"type", "Sequence"},
                      {"decoders", json::array({{{"type", "ByteFallback"}}, {{"type", "Fuse"}}})}},
                     {"<0xC3>", "<0xA9>", "x", "<0xZZ>"}),
              ElementsAre("\xC3\xA9x<0xZZ>"));
  EXPECT_THAT(Decode({{"type", "Strip"}, {"content", " "}, {"start", 2}, {"stop", 1}}, {"   a  "}),
              ElementsAre(" a "));
}

TEST(AddedTokensTest, LongestMatchAndStripFlags) {
  std::vector<AddedToken> tokens = {{.content = "<a>", .id = 1},
                                    {.content = "<a><b>", .id = 2},
                                    {.content = "[L]", .id = 3, .lstrip = true},
                                    {.content = "w", .id = 4, .single_word = true}};
  AddedTokenMatcher m(tokens);
  auto ids = [&](std::string_view text) {
    std::vector<std::string> out;
    for (const auto& s : m.Split(text)) {
      std::string quoted = "'";
      quoted.append(s.text);
      quoted.push_back('\'');
      out.push_back(s.id >= 0 ? std::to_string(s.id) : quoted);
    }
    return out;
  };
  EXPECT_THAT(ids("x<a><b>y<a>"), ElementsAre("'x'", "2", "'y'", "1"));
  EXPECT_THAT(ids("x   [L]"), ElementsAre("'x'", "3"));
  EXPECT_THAT(ids("a w b"), ElementsAre("'a '", "4", "' b'"));
  EXPECT_THAT(ids("awb"), ElementsAre("'awb'"));  // single_word: inside a word, no match
}

}  // namespace
}  // namespace tandem::tokenizer
