#include "common/tokenizer/tokenizer.h"

#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/tokenizer/test_tokenizers.h"

namespace tandem::tokenizer {
namespace {

using testing::ByteLevelJson;
using ::testing::ElementsAre;
using testing::Id;
using ::testing::IsEmpty;
using testing::SentencePieceJson;

std::unique_ptr<Tokenizer> Make(const nlohmann::json& doc, const std::string& config = "") {
  auto t = Tokenizer::FromJson(doc.dump(), config);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? std::move(t).value() : nullptr;
}

std::vector<int32_t> Enc(const Tokenizer& t, const std::string& text, bool special = false) {
  auto ids = t.Encode(text, special);
  EXPECT_TRUE(ids.ok()) << ids.status();
  return ids.value_or(std::vector<int32_t>{});
}

std::string Dec(const Tokenizer& t, const std::vector<int32_t>& ids, bool skip = false) {
  auto text = t.Decode(ids, skip);
  EXPECT_TRUE(text.ok()) << text.status();
  return text.value_or("<error>");
}

TEST(ByteLevelTokenizerTest, MergesInRankOrder) {
  auto doc = ByteLevelJson();
  auto t = Make(doc);
  EXPECT_THAT(Enc(*t, "hello"), ElementsAre(Id(doc, "hello")));
  EXPECT_THAT(Enc(*t, " hello"), ElementsAre(Id(doc, "\xC4\xA0hello")));
  EXPECT_THAT(Enc(*t, "hello the"), ElementsAre(Id(doc, "hello"), Id(doc, "\xC4\xA0the")));
  // The split regex isolates "   " (\s+(?!\S)) from " x"; ties merge leftmost first.
  EXPECT_THAT(Enc(*t, "    x"),
              ElementsAre(Id(doc, "\xC4\xA0\xC4\xA0"), ' ', Id(doc, "\xC4\xA0"), 'x'));
}

TEST(ByteLevelTokenizerTest, NonAsciiBytesUseMappedCharacters) {
  auto t = Make(ByteLevelJson());
  // U+00E9 is C3 A9; byte-level vocab ids here equal the byte values.
  EXPECT_THAT(Enc(*t, "\xC3\xA9"), ElementsAre(0xC3, 0xA9));
  EXPECT_EQ(Dec(*t, {0xC3, 0xA9}), "\xC3\xA9");
  // Half a character decodes to U+FFFD rather than ill-formed output.
  EXPECT_EQ(Dec(*t, {0xC3}), "\xEF\xBF\xBD");
}

TEST(ByteLevelTokenizerTest, RoundTripsMixedText) {
  auto t = Make(ByteLevelJson());
  for (const std::string text :
       {"hello the world", "  tabs\tand\nnewlines  ", "\xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x98\x80",
        "x = f(1, 2) // comment", "", "<|bos|>hi<tool>  there"}) {
    EXPECT_EQ(Dec(*t, Enc(*t, text)), text == "<|bos|>hi<tool>  there"
                                          ? "<|bos|>hi<tool>there"  // rstrip ate the spaces
                                          : text);
  }
}

TEST(ByteLevelTokenizerTest, AddedTokensMatchedBeforeBpe) {
  auto doc = ByteLevelJson();
  auto t = Make(doc);
  EXPECT_THAT(Enc(*t, "<|bos|>hi"), ElementsAre(300, 'h', 'i'));
  EXPECT_THAT(Enc(*t, "<tool>   x"), ElementsAre(301, 'x'));  // rstrip
  EXPECT_THAT(Enc(*t, "<|bos"), ElementsAre('<', '|', 'b', 'o', 's'));
  EXPECT_EQ(Dec(*t, {300, 'h', 'i'}, /*skip=*/true), "hi");
  EXPECT_EQ(Dec(*t, {301, 'h', 'i'}, /*skip=*/true), "<tool>hi");  // not special
}

TEST(ByteLevelTokenizerTest, ConfigAddsBos) {
  auto doc = ByteLevelJson();
  auto plain = Make(doc);
  EXPECT_THAT(Enc(*plain, "hello", true), ElementsAre(Id(doc, "hello")));
  EXPECT_EQ(plain->bos_id(), -1);
  auto with_bos = Make(doc, R"({"bos_token": "<|bos|>", "eos_token": {"content": "<tool>"},
                               "add_bos_token": true})");
  EXPECT_EQ(with_bos->bos_id(), 300);
  EXPECT_EQ(with_bos->eos_id(), 301);
  EXPECT_THAT(Enc(*with_bos, "hello", true), ElementsAre(300, Id(doc, "hello")));
  EXPECT_THAT(Enc(*with_bos, "hello", false), ElementsAre(Id(doc, "hello")));
  EXPECT_EQ(with_bos->vocab_size(), 302);
}

TEST(ByteLevelTokenizerTest, IgnoreMergesTakesWholeWord) {
  auto doc = ByteLevelJson();
  doc["model"]["vocab"]["xyz"] = 400;
  EXPECT_THAT(Enc(*Make(doc), "xyz"), ElementsAre('x', 'y', 'z'));
  doc["model"]["ignore_merges"] = true;
  EXPECT_THAT(Enc(*Make(doc), "xyz"), ElementsAre(400));
}

TEST(ByteLevelTokenizerTest, InvalidUtf8IsInvalidArgument) {
  auto t = Make(ByteLevelJson());
  for (const std::string bad : {"\xFF", "ab\xC3", "\xED\xA0\x80", "\xC0\xAF", "ok\x80ok"}) {
    auto ids = t->Encode(bad, false);
    ASSERT_FALSE(ids.ok());
    EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(ids.status().message()), ::testing::HasSubstr("UTF-8"));
  }
}

TEST(ByteLevelTokenizerTest, DecodeRejectsUnknownIds) {
  auto t = Make(ByteLevelJson());
  EXPECT_EQ(t->Decode({5000}, false).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t->Decode({-1}, false).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ByteLevelTokenizerTest, EncodeIsThreadSafe) {
  auto t = Make(ByteLevelJson());
  const std::string text = "hello the world, hello again; the end. ";
  std::vector<int32_t> want = Enc(*t, text);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&] {
      for (int k = 0; k < 200; ++k) {
        auto ids = t->Encode(text, false);
        if (!ids.ok() || *ids != want) ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST(SentencePieceTokenizerTest, PrependReplaceAndTemplateBos) {
  auto doc = SentencePieceJson();
  auto t = Make(doc);
  std::vector<int32_t> ids = Enc(*t, "hello world", true);
  EXPECT_THAT(ids, ElementsAre(1, Id(doc, "\xE2\x96\x81hello"), Id(doc, "\xE2\x96\x81w"),
                               Id(doc, "or"), Id(doc, "l"), Id(doc, "d")));
  EXPECT_EQ(Dec(*t, ids, /*skip=*/true), "hello world");
  EXPECT_EQ(Dec(*t, ids, /*skip=*/false), "<s>hello world");
}

TEST(SentencePieceTokenizerTest, ByteFallbackForUnknownCharacters) {
  auto doc = SentencePieceJson();
  auto t = Make(doc);
  EXPECT_THAT(Enc(*t, "h\xC3\xA9"),
              ElementsAre(Id(doc, "\xE2\x96\x81h"), Id(doc, "<0xC3>"), Id(doc, "<0xA9>")));
  EXPECT_EQ(Dec(*t, Enc(*t, "h\xC3\xA9 \xF0\x9F\x98\x80!")), "h\xC3\xA9 \xF0\x9F\x98\x80!");
}

TEST(SentencePieceTokenizerTest, UnknownWithoutByteFallbackFusesUnk) {
  auto doc = SentencePieceJson();
  doc["model"]["byte_fallback"] = false;
  auto t = Make(doc);
  EXPECT_THAT(Enc(*t, "h\xC3\xA9\xC3\xA9"), ElementsAre(Id(doc, "\xE2\x96\x81h"), 0));
}

TEST(SentencePieceTokenizerTest, SpecialTokenStringsRoundTrip) {
  auto doc = SentencePieceJson();
  auto t = Make(doc);
  std::vector<int32_t> ids = Enc(*t, "hello<s> hello");
  EXPECT_THAT(ids, ElementsAre(Id(doc, "\xE2\x96\x81hello"), 1, Id(doc, "\xE2\x96\x81"),
                               Id(doc, "\xE2\x96\x81hello")));
  EXPECT_EQ(Dec(*t, ids), "hello<s> hello");
  EXPECT_THAT(Enc(*t, ""), IsEmpty());
  EXPECT_THAT(Enc(*t, "", true), ElementsAre(1));
}

TEST(SentencePieceTokenizerTest, LongWordWithoutSpacesIsFast) {
  auto t = Make(SentencePieceJson());
  std::string text;
  for (int i = 0; i < 100000; ++i) text += "hello";  // 500 KB, one word.
  std::vector<int32_t> ids = Enc(*t, text);
  // "hello" after the first: h + ell + o (there is no "he" merge).
  EXPECT_EQ(ids.size(), 1 + 3 * 99999);
  EXPECT_EQ(Dec(*t, ids), text);
}

}  // namespace
}  // namespace tandem::tokenizer

namespace tandem::tokenizer {
namespace {

TEST(SentencePieceTokenizerTest, NormalizedAddedTokensMatchAfterNormalization) {
  auto doc = testing::SentencePieceJson();
  // "\u2581wor" only exists after Prepend/Replace have turned spaces into U+2581.
  doc["added_tokens"].push_back(
      {{"id", 400}, {"content", "\xE2\x96\x81wor"}, {"special", false}, {"normalized", true}});
  auto t = Tokenizer::FromJson(doc.dump(), "").value();
  auto ids = t->Encode("hello world", false).value();
  EXPECT_THAT(ids, ::testing::ElementsAre(testing::Id(doc, "\xE2\x96\x81hello"), 400,
                                          testing::Id(doc, "l"), testing::Id(doc, "d")));
  EXPECT_EQ(t->Decode(ids, false).value(), "hello world");
  // The same token marked normalized=false only matches the literal raw text.
  doc["added_tokens"].back()["normalized"] = false;
  t = Tokenizer::FromJson(doc.dump(), "").value();
  EXPECT_THAT(t->Encode("hello world", false).value(), ::testing::Not(::testing::Contains(400)));
  EXPECT_THAT(t->Encode("\xE2\x96\x81wor", false).value(), ::testing::ElementsAre(400));
}

}  // namespace
}  // namespace tandem::tokenizer
