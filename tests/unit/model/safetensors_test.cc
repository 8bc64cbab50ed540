#include "common/model/safetensors.h"

#include <cstring>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::model {
namespace {

using ::testing::HasSubstr;

std::string Build(const std::string& header, size_t data_bytes) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  out += header;
  out += std::string(data_bytes, '\x01');
  return out;
}

absl::StatusOr<std::vector<TensorEntry>> Parse(const std::string& bytes) {
  uint64_t start = 0;
  return ParseSafetensorsHeader(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(),
                                "w.safetensors", &start);
}

TEST(SafetensorsTest, ParsesEntries) {
  std::string f = Build(
      R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
      R"("b":{"dtype":"BF16","shape":[4],"data_offsets":[24,32]},"s":{"dtype":"I64","shape":[],"data_offsets":[32,40]}})",
      40);
  auto t = Parse(f);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->size(), 3u);
  for (const auto& e : *t) {
    if (e.name == "a") {
      EXPECT_EQ(e.dtype, StDType::kF32);
      EXPECT_EQ(e.shape, (std::vector<int64_t>{2, 3}));
    }
    if (e.name == "s") {
      EXPECT_TRUE(e.shape.empty());
    }
  }
}

TEST(SafetensorsTest, RejectsLiesWithMessagesNamingFileAndTensor) {
  struct Case {
    std::string header;
    size_t data;
    std::string expect;
  };
  std::vector<Case> cases = {
      {R"({"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})", 24, "span 20 bytes"},
      {R"({"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}})", 16, "outside the data"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 16, "outside the data"},
      {R"({"a":{"dtype":"Q4","shape":[2],"data_offsets":[0,8]}})", 8, "unknown dtype"},
      {R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8, "bad dimension"},
      {R"({"a":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,8]}})", 8,
       "larger than the file"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8, "data_offsets"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
       12, "overlaps"},
      {R"({"a":[1,2]})", 0, "entry must be an object"},
      {R"({"a":)", 0, "not valid JSON"},
  };
  for (const auto& c : cases) {
    auto t = Parse(Build(c.header, c.data));
    ASSERT_FALSE(t.ok()) << c.header;
    EXPECT_THAT(std::string(t.status().message()), HasSubstr("w.safetensors")) << c.header;
    EXPECT_THAT(std::string(t.status().message()), HasSubstr(c.expect)) << c.header;
  }
}

TEST(SafetensorsTest, RejectsTruncationAtEveryLength) {
  std::string f = Build(R"({"a":{"dtype":"F16","shape":[3],"data_offsets":[0,6]}})", 6);
  ASSERT_TRUE(Parse(f).ok());
  for (size_t n = 0; n < f.size(); ++n) {
    EXPECT_FALSE(Parse(f.substr(0, n)).ok()) << n;
  }
  std::string huge(8, '\xff');
  EXPECT_THAT(std::string(Parse(huge).status().message()), HasSubstr("header length"));
}

TEST(SafetensorsTest, OpenReportsMissingFile) {
  auto f = SafetensorsFile::Open("/nonexistent/model.safetensors");
  EXPECT_EQ(f.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(f.status().message()), HasSubstr("/nonexistent/model.safetensors"));
}

}  // namespace
}  // namespace tandem::model
