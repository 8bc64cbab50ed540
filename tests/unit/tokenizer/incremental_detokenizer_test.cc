#include "common/tokenizer/incremental_detokenizer.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/tokenizer/test_tokenizers.h"

namespace tandem::tokenizer {
namespace {

using testing::ByteLevelJson;
using ::testing::ElementsAre;
using testing::Id;
using testing::SentencePieceJson;

std::vector<std::string> Stream(const Tokenizer& t, const std::vector<int32_t>& ids) {
  IncrementalDetokenizer detok(t, /*skip_special_tokens=*/false);
  std::vector<std::string> out;
  for (int32_t id : ids) {
    auto piece = detok.Add(id);
    EXPECT_TRUE(piece.ok()) << piece.status();
    out.push_back(piece.value_or("<error>"));
  }
  out.push_back(detok.Flush());
  return out;
}

TEST(IncrementalDetokenizerTest, ByteFallbackAcrossTokensEmitsWholeCharacters) {
  auto doc = SentencePieceJson();
  auto t = Tokenizer::FromJson(doc.dump(), "").value();
  // "hello 😀 world": the emoji is four <0xNN> tokens.
  auto ids = t->Encode("hello \xF0\x9F\x98\x80 world", false).value();
  std::vector<std::string> pieces = Stream(*t, ids);
  std::string joined;
  for (const auto& p : pieces) joined += p;
  EXPECT_EQ(joined, "hello \xF0\x9F\x98\x80 world");
  // Three of the byte tokens produce nothing; the fourth produces the whole emoji.
  int empty = 0;
  for (const auto& p : pieces) empty += p.empty();
  EXPECT_GE(empty, 3);
  EXPECT_THAT(pieces, ::testing::Contains("\xF0\x9F\x98\x80"));
}

TEST(IncrementalDetokenizerTest, LeadingSpaceRulesMatchFullDecode) {
  auto doc = SentencePieceJson();
  auto t = Tokenizer::FromJson(doc.dump(), "").value();
  auto ids = t->Encode("hello world hello", false).value();
  std::string joined;
  for (const auto& p : Stream(*t, ids)) joined += p;
  EXPECT_EQ(joined, t->Decode(ids, false).value());
}

TEST(IncrementalDetokenizerTest, ByteLevelSplitCharacter) {
  auto t = Tokenizer::FromJson(ByteLevelJson().dump(), "").value();
  // U+00E9 as two byte-level tokens, then 'x'.
  EXPECT_THAT(Stream(*t, {0xC3, 0xA9, 'x'}), ElementsAre("", "\xC3\xA9", "x", ""));
  // A truncated character at the end of the stream is flushed as U+FFFD.
  EXPECT_THAT(Stream(*t, {'a', 0xE2, 0x82}), ElementsAre("a", "", "", "\xEF\xBF\xBD"));
}

TEST(IncrementalDetokenizerTest, BadIdIsAnErrorAndLeavesStreamUsable) {
  auto t = Tokenizer::FromJson(ByteLevelJson().dump(), "").value();
  IncrementalDetokenizer detok(*t, false);
  EXPECT_EQ(detok.Add('a').value(), "a");
  EXPECT_FALSE(detok.Add(99999).ok());
  EXPECT_EQ(detok.Add('b').value(), "b");
}

}  // namespace
}  // namespace tandem::tokenizer

namespace tandem::tokenizer {
namespace {

TEST(IncrementalDetokenizerTest, EndlessIncompleteOutputStaysBoundedAndEqualsDecode) {
  auto t = Tokenizer::FromJson(testing::ByteLevelJson().dump(), "").value();
  // Every step ends in a lead byte that the next token never completes.
  std::vector<int32_t> ids;
  for (int i = 0; i < 500; ++i) {
    ids.push_back('x');
    ids.push_back(0xE4);
  }
  IncrementalDetokenizer detok(*t, false);
  std::string streamed;
  for (int32_t id : ids) streamed += detok.Add(id).value();
  streamed += detok.Flush();
  EXPECT_EQ(streamed, t->Decode(ids, false).value());
}

}  // namespace
}  // namespace tandem::tokenizer
