#include "common/util/cli_args.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace tandem {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

absl::StatusOr<CliArgs> Parse(std::vector<std::string> words) {
  std::vector<char*> argv = {const_cast<char*>("prog")};
  for (auto& w : words) argv.push_back(w.data());
  return CliArgs::Parse(static_cast<int>(argv.size()), argv.data(), {"verbose"});
}

TEST(CliArgsTest, ParsesEveryFlagForm) {
  auto args = Parse({"run", "--model", "/m", "--threads=4", "--verbose", "extra"});
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_THAT(args->positional(), ElementsAre("run", "extra"));
  EXPECT_EQ(args->String("model").value(), "/m");
  EXPECT_EQ(args->IntOr("threads", 0).value(), 4);
  EXPECT_EQ(args->StringOr("verbose", ""), "true");
  EXPECT_EQ(args->IntOr("absent", 7).value(), 7);
  EXPECT_THAT(args->String("absent").status().message(), HasSubstr("--absent is required"));
}

TEST(CliArgsTest, RepeatedFlagsKeepEveryValue) {
  auto args = Parse({"--set", "a=1", "--set=b=2", "--set", "c=[x, y]"});
  ASSERT_TRUE(args.ok());
  EXPECT_THAT(args->All("set"), ElementsAre("a=1", "b=2", "c=[x, y]"));
  EXPECT_EQ(args->String("set").value(), "c=[x, y]");  // single-value accessors: the last
  EXPECT_TRUE(args->All("other").empty());
}

TEST(CliArgsTest, BadValuesAreNamed) {
  EXPECT_THAT(Parse({"--model"}).status().message(), HasSubstr("--model needs a value"));
  auto args = Parse({"--threads", "four", "--temp", "nan", "--ids", "1,x"});
  ASSERT_TRUE(args.ok());
  EXPECT_THAT(args->IntOr("threads", 0).status().message(), HasSubstr("--threads"));
  EXPECT_THAT(args->DoubleOr("temp", 0).status().message(), HasSubstr("--temp"));
  EXPECT_FALSE(args->IntList("ids").ok());
  EXPECT_THAT(args->CheckKnown({"threads", "temp"}).message(), HasSubstr("--ids"));
}

TEST(CliArgsTest, ByteSizes) {
  EXPECT_EQ(ParseByteSize("1024").value(), 1024);
  EXPECT_EQ(ParseByteSize("2GiB").value(), int64_t{2} << 30);
  EXPECT_EQ(ParseByteSize("512Mi").value(), int64_t{512} << 20);
  EXPECT_EQ(ParseByteSize("3GB").value(), int64_t{3000000000});
  EXPECT_EQ(ParseByteSize("4K").value(), 4000);
  EXPECT_FALSE(ParseByteSize("").ok());
  EXPECT_FALSE(ParseByteSize("GiB").ok());
  EXPECT_EQ(ParseByteSize("1.5GiB").value(), int64_t{3} << 29);
  EXPECT_FALSE(ParseByteSize("nan").ok());
  EXPECT_FALSE(ParseByteSize("-1").ok());
  EXPECT_FALSE(ParseByteSize("99999999999TiB").ok());
}

}  // namespace
}  // namespace tandem
