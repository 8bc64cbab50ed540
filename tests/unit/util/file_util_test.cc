#include "common/util/file_util.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>

namespace tandem {
namespace {

using ::testing::HasSubstr;

class FileUtilTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("tandem_file_util_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // A named pipe whose writer, on its own thread, writes `data` and closes.
  std::string Fifo(std::string data) {
    const std::string path = (dir_ / "fifo").string();
    EXPECT_EQ(mkfifo(path.c_str(), 0600), 0);
    writer_ = std::thread([path, data = std::move(data)] {
      FILE* f = std::fopen(path.c_str(), "w");  // blocks until the reader opens
      if (f == nullptr) return;
      std::fwrite(data.data(), 1, data.size(), f);
      std::fclose(f);
    });
    return path;
  }
  void JoinWriter() {
    if (writer_.joinable()) writer_.join();
  }

  std::filesystem::path dir_;
  std::thread writer_;
};

TEST_F(FileUtilTest, ReadsARegularFile) {
  const std::string path = (dir_ / "a.json").string();
  ASSERT_TRUE(WriteStringToFile(path, "{\"x\": 1}").ok());
  auto text = ReadFileToString(path);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "{\"x\": 1}");
  auto small = ReadFileToString(path, 4);
  ASSERT_FALSE(small.ok());
  EXPECT_THAT(small.status().message(), HasSubstr("more than the limit of 4"));
}

// A pipe (`tandem serve --config <(...)`) has no size: it is read to its end.
TEST_F(FileUtilTest, ReadsAPipeToItsEnd) {
  std::string big(200'000, 'x');
  for (size_t i = 0; i < big.size(); i += 7) big[i] = static_cast<char>('a' + i % 26);
  const std::string path = Fifo(big);
  auto text = ReadFileToString(path);
  JoinWriter();
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, big);
}

TEST_F(FileUtilTest, APipeLongerThanTheLimitIsAnError) {
  const std::string path = Fifo(std::string(5000, 'y'));
  // The pipe's buffer (64 KiB) takes all 5000 bytes, so the writer finishes whatever the
  // reader does.
  auto text = ReadFileToString(path, 4096);
  JoinWriter();
  ASSERT_FALSE(text.ok());
  EXPECT_THAT(text.status().message(), HasSubstr("more than the limit of 4096 bytes"));
}

TEST_F(FileUtilTest, ADirectoryOrAMissingFileIsAnError) {
  auto dir = ReadFileToString(dir_.string());
  ASSERT_FALSE(dir.ok());
  EXPECT_THAT(dir.status().message(), HasSubstr("is a directory"));
  auto missing = ReadFileToString((dir_ / "none").string());
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr("none"));
}

}  // namespace
}  // namespace tandem
