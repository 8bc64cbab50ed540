#include "common/model/safetensors.h"

#include <cstring>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/testing/temp_model.h"

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

// The weights' fingerprint (part of every KV block's hash) changes when any one tensor of a
// large file is edited, as a fine-tune of one layer or a merged adapter edits it, not only
// where file-wide samples happen to fall: 256 tensors of 32 KiB (8 MiB), where 64 samples
// spread over the file would miss three tensors in four (the second, at 32-64 KiB, among
// them).
TEST(SafetensorsTest, FingerprintChangesWithAnyOneTensor) {
  constexpr int kTensors = 256;
  constexpr size_t kBytes = 32 << 10;
  std::vector<SafetensorsTensor> tensors(kTensors);
  for (int i = 0; i < kTensors; ++i) {
    tensors[i] = {.name = "layer." + std::to_string(i),
                  .dtype = StDType::kF32,
                  .shape = {static_cast<int64_t>(kBytes / 4)},
                  .bytes = std::string(kBytes, static_cast<char>(i))};
  }
  const std::string dir = testing::MakeTempDir("fingerprint");
  auto fingerprint = [&](const std::vector<SafetensorsTensor>& t, const std::string& name) {
    const std::string path = dir + "/" + name + ".safetensors";
    EXPECT_TRUE(WriteSafetensorsFile(path, t).ok());
    auto f = SafetensorsFile::Open(path);
    EXPECT_TRUE(f.ok()) << f.status();
    return f.ok() ? (*f)->Fingerprint(7) : 0;
  };
  const uint64_t base = fingerprint(tensors, "base");
  EXPECT_EQ(fingerprint(tensors, "copy"), base);  // the same bytes elsewhere
  for (const int edited : {0, 1, 2, 77, 128, 254, 255}) {
    std::vector<SafetensorsTensor> tuned = tensors;
    // Every value of the tensor moved a little (the lowest mantissa bit of each float).
    for (size_t b = 0; b < kBytes; b += 4) tuned[edited].bytes[b] ^= 1;
    EXPECT_NE(fingerprint(tuned, "tuned" + std::to_string(edited)), base) << edited;
    // And one float in the middle of it, where a sample of that tensor reads.
    std::vector<SafetensorsTensor> one = tensors;
    one[edited].bytes[(kBytes / 2) & ~size_t{3}] ^= 1;
    EXPECT_NE(fingerprint(one, "one" + std::to_string(edited)), base) << edited;
  }
}

}  // namespace
}  // namespace tandem::model
