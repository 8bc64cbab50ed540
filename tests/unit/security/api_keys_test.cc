#include "common/security/api_keys.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "tests/unit/testing/eventually.h"

namespace tandem::security {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

TEST(ApiKeysTest, DigestIsSha256) {
  // FIPS 180-2's example.
  EXPECT_EQ(KeyDigestHex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  auto a = NewApiKey();
  auto b = NewApiKey();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->size(), 4u + 64u);
  EXPECT_NE(*a, *b);
}

TEST(ApiKeysTest, ParsesLinesWithLimitsAndRefusesAnythingElse) {
  const std::string d1 = KeyDigestHex("one"), d2 = KeyDigestHex("two");
  auto keys = ParseApiKeys(absl::StrCat("# comment\n\n", d1, " alice max_concurrent=3\n", d2,
                                        "\tbatch tokens_per_minute=500  # nightly\n"),
                           {.max_concurrent = 7, .tokens_per_minute = 0});
  ASSERT_TRUE(keys.ok()) << keys.status();
  ASSERT_EQ(keys->size(), 2u);
  EXPECT_EQ((*keys)[0].name, "alice");
  EXPECT_EQ((*keys)[0].limits.max_concurrent, 3);
  EXPECT_EQ((*keys)[1].limits.max_concurrent, 7);  // the default
  EXPECT_EQ((*keys)[1].limits.tokens_per_minute, 500);

  const struct {
    std::string text;
    std::string error;
  } bad[] = {
      {"tdm-plaintextkey alice", "line 1: the first field must be the key's SHA-256"},
      {d1, "line 1: expected a SHA-256 digest (64 hex digits) and a name"},
      {d1 + " al/ice", "a key's name is"},
      {d1 + " alice speed=3", "unknown limit \"speed\""},
      {d1 + " alice max_concurrent=-1", "a limit is NAME=N"},
      {d1 + " alice\n" + d2 + " alice", "line 2: the name alice is used twice"},
      {d1 + " alice\n" + d1 + " bob", "line 2: this digest is already a key"},
  };
  for (const auto& b : bad) {
    EXPECT_THAT(ParseApiKeys(b.text, {}).status().message(), HasSubstr(b.error)) << b.text;
  }
}

class ApiKeysFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = (fs::temp_directory_path() / absl::StrCat("tandem_keys_", getpid(), ".txt")).string();
  }
  void TearDown() override { fs::remove(path_); }
  // Replaces the file as an operator (or Kubernetes) would: a new file renamed over the old.
  void Write(const std::string& text) {
    {
      std::ofstream out(path_ + ".new");
      out << text;
    }
    fs::rename(path_ + ".new", path_);
  }
  std::string path_;
};

TEST_F(ApiKeysFileTest, BearerKeysAreCheckedAndRevokedKeysRefused) {
  Write(absl::StrCat(KeyDigestHex("k-alice"), " alice\n", KeyDigestHex("k-bob"), " bob\n"));
  metrics::Metrics metrics;
  auto keys = ApiKeys::Load(path_, {}, &metrics);
  ASSERT_TRUE(keys.ok()) << keys.status();
  EXPECT_EQ(*(*keys)->Authenticate("Bearer k-alice", "/x"), "alice");
  EXPECT_EQ(*(*keys)->Authenticate("bearer   k-bob ", "/x"), "bob");
  for (const char* h : {"", "k-alice", "Basic k-alice", "Bearer ", "Bearer k-alicex"}) {
    const absl::Status s = (*keys)->Authenticate(h, "/x").status();
    EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated) << h;
  }
  EXPECT_EQ(metrics.AuthDenied("/x", "api_key")->Value(), 5);

  // bob is revoked: the file changes, and the next look (within a second or so) drops him.
  Write(absl::StrCat(KeyDigestHex("k-alice"), " alice\n"));
  EXPECT_TRUE(
      testing::Eventually([&] { return !(*keys)->Authenticate("Bearer k-bob", "/x").ok(); }));
  EXPECT_TRUE((*keys)->Authenticate("Bearer k-alice", "/x").ok());
  // A file that no longer parses keeps the keys it held.
  Write("not a key file\n");
  EXPECT_TRUE(testing::Eventually(
      [&] { return (*keys)->size() == 1 && (*keys)->Authenticate("Bearer k-alice", "/x").ok(); }));
  EXPECT_FALSE(ApiKeys::Load(path_ + ".missing", {}, nullptr).ok());
}

TEST_F(ApiKeysFileTest, ConcurrencyLimitHoldsAndFreesWithTheLease) {
  Write(absl::StrCat(KeyDigestHex("k"), " alice max_concurrent=2\n", KeyDigestHex("j"), " bob\n"));
  metrics::Metrics metrics;
  auto keys = *ApiKeys::Load(path_, {.max_concurrent = 1}, &metrics);
  auto first = keys->Admit("Bearer k", "/x");
  auto second = keys->Admit("Bearer k", "/x");
  ASSERT_TRUE(first.ok() && second.ok());
  const absl::Status third = keys->Admit("Bearer k", "/x").status();
  EXPECT_EQ(third.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(third.message(), HasSubstr("max_concurrent=2"));
  EXPECT_EQ(RetryAfterSeconds(third), 1);
  // bob has the default limit, 1, of his own.
  auto bob = keys->Admit("Bearer j", "/x");
  ASSERT_TRUE(bob.ok());
  EXPECT_FALSE(keys->Admit("Bearer j", "/x").ok());
  first->reset();
  EXPECT_TRUE(keys->Admit("Bearer k", "/x").ok());
  EXPECT_EQ(metrics.ApiKeyRequests("alice", "ok")->Value(), 3);
  EXPECT_EQ(metrics.ApiKeyRequests("alice", "max_concurrent")->Value(), 1);
}

TEST_F(ApiKeysFileTest, TokensPerMinuteRefusesWithARetryHint) {
  Write(absl::StrCat(KeyDigestHex("k"), " alice tokens_per_minute=100\n"));
  metrics::Metrics metrics;
  auto keys = *ApiKeys::Load(path_, {}, &metrics);
  for (int i = 0; i < 2; ++i) {  // 60 then 120 tokens: the second starts under the limit
    auto lease = keys->Admit("Bearer k", "/x");
    ASSERT_TRUE(lease.ok()) << i << lease.status();
    (*lease)->AddTokens(60);
  }
  const absl::Status s = keys->Admit("Bearer k", "/x").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr("tokens_per_minute"));
  ASSERT_TRUE(RetryAfterSeconds(s).has_value());
  EXPECT_GE(*RetryAfterSeconds(s), 1);
  EXPECT_LE(*RetryAfterSeconds(s), 60);
  EXPECT_EQ(metrics.ApiKeyTokens("alice")->Value(), 120);
}

}  // namespace
}  // namespace tandem::security
