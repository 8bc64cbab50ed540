#include "common/util/utf8.h"

#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(Utf8Test, Validate) {
  EXPECT_TRUE(ValidateUtf8("plain ascii").ok());
  EXPECT_TRUE(ValidateUtf8("\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80").ok());
  EXPECT_FALSE(ValidateUtf8("\xC3").ok());              // truncated
  EXPECT_FALSE(ValidateUtf8("\xC0\x80").ok());          // overlong
  EXPECT_FALSE(ValidateUtf8("\xED\xA0\x80").ok());      // surrogate
  EXPECT_FALSE(ValidateUtf8("\xF4\x90\x80\x80").ok());  // > U+10FFFF
  EXPECT_FALSE(ValidateUtf8("\x80").ok());
}

TEST(Utf8Test, IncompleteSuffix) {
  EXPECT_EQ(IncompleteUtf8Suffix("ab"), 0u);
  EXPECT_EQ(IncompleteUtf8Suffix("a\xF0\x9F"), 2u);
  EXPECT_EQ(IncompleteUtf8Suffix("a\xF0\x9F\x98"), 3u);
  EXPECT_EQ(IncompleteUtf8Suffix("a\xF0\x9F\x98\x80"), 0u);
  EXPECT_EQ(IncompleteUtf8Suffix("a\xE0\x80"), 0u);  // can never complete
}

TEST(Utf8Test, ToValidReplacesIllFormed) {
  EXPECT_EQ(ToValidUtf8("a\xFF"
                        "b"),
            "a\xEF\xBF\xBD"
            "b");
  EXPECT_EQ(ToValidUtf8("\xC3\xA9"), "\xC3\xA9");
}

}  // namespace
}  // namespace tandem
