// Text deltas of a token stream: whole UTF-8 characters only, cut before the first stop
// string even when it arrives split across tokens, nothing after it.
#include "router/output_assembler.h"

#include <gtest/gtest.h>

#include "tests/unit/tokenizer/test_tokenizers.h"

namespace tandem::router {
namespace {

// The byte-level test vocabulary maps each byte to the id of its value.
std::vector<int32_t> Bytes(const std::string& s) {
  std::vector<int32_t> ids;
  for (unsigned char c : s) ids.push_back(c);
  return ids;
}

class OutputAssemblerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto t = tokenizer::Tokenizer::FromJson(tokenizer::testing::ByteLevelJson().dump(), "");
    ASSERT_TRUE(t.ok()) << t.status();
    tokenizer_ = std::move(*t);
    for (int i = 0; i < 256; ++i) {
      std::vector<int32_t> ids = {i};
      ASSERT_EQ(tokenizer_->DecodeBytes(ids, true).value(), std::string(1, char(i)));
    }
  }

  // Feeds `text` one byte-token at a time; returns what the client saw.
  std::string Stream(OutputAssembler& a, const std::string& text, bool* stopped) {
    std::string out;
    for (int32_t id : Bytes(text)) {
      auto d = a.Add(std::span<const int32_t>(&id, 1));
      EXPECT_TRUE(d.ok());
      out += d->text;
      if (d->stopped) {
        *stopped = true;
        return out;
      }
    }
    *stopped = false;
    return out + a.Flush();
  }

  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
};

TEST_F(OutputAssemblerTest, NoStopStringsPassesEverything) {
  OutputAssembler a(tokenizer_.get(), {});
  bool stopped;
  EXPECT_EQ(Stream(a, "héllo wörld", &stopped), "héllo wörld");
  EXPECT_FALSE(stopped);
}

TEST_F(OutputAssemblerTest, SplitCharactersWaitForTheirLastByte) {
  OutputAssembler a(tokenizer_.get(), {});
  const std::vector<int32_t> ids = Bytes("é");  // two bytes
  auto first = a.Add(std::span<const int32_t>(ids.data(), 1));
  EXPECT_EQ(first->text, "");
  EXPECT_EQ(first->token_ids.size(), 1u);
  auto second = a.Add(std::span<const int32_t>(ids.data() + 1, 1));
  EXPECT_EQ(second->text, "é");
}

TEST_F(OutputAssemblerTest, CutsBeforeTheFirstStopString) {
  OutputAssembler a(tokenizer_.get(), {"\n\n", "END"});
  bool stopped;
  EXPECT_EQ(Stream(a, "one\ntwo END three\n\n", &stopped), "one\ntwo ");
  EXPECT_TRUE(stopped);
  EXPECT_EQ(a.num_tokens(), 11);  // up to and including the token that completed "END"
  auto after = a.Add(Bytes("more"));
  EXPECT_TRUE(after->token_ids.empty());
}

TEST_F(OutputAssemblerTest, HoldsBackAPossibleStopPrefixAndReleasesIt) {
  OutputAssembler a(tokenizer_.get(), {"STOP"});
  std::string seen;
  for (int32_t id : Bytes("a STO")) seen += a.Add(std::span<const int32_t>(&id, 1))->text;
  EXPECT_EQ(seen, "a ");  // "STO" may begin "STOP"
  for (int32_t id : Bytes("NE")) seen += a.Add(std::span<const int32_t>(&id, 1))->text;
  EXPECT_EQ(seen, "a STONE");
  EXPECT_FALSE(a.stopped());
}

TEST_F(OutputAssemblerTest, FlushReleasesAHeldPrefix) {
  OutputAssembler a(tokenizer_.get(), {"STOP"});
  bool stopped;
  EXPECT_EQ(Stream(a, "the end ST", &stopped), "the end ST");
  EXPECT_FALSE(stopped);
}

TEST_F(OutputAssemblerTest, MultiByteStopString) {
  OutputAssembler a(tokenizer_.get(), {"。"});
  bool stopped;
  EXPECT_EQ(Stream(a, "你好。再见", &stopped), "你好");
  EXPECT_TRUE(stopped);
}

TEST_F(OutputAssemblerTest, WithoutATokenizerOnlyIdsFlow) {
  OutputAssembler a(nullptr, {"x"});
  auto d = a.Add(Bytes("xyz"));
  EXPECT_EQ(d->token_ids.size(), 3u);
  EXPECT_EQ(d->text, "");
  EXPECT_FALSE(d->stopped);
}

}  // namespace
}  // namespace tandem::router
