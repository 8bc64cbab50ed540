#include "common/util/populate.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <string>

#include "tests/unit/testing/sanitizers.h"

namespace tandem {
namespace {

int64_t MemTotalBytes() {
  std::ifstream f("/proc/meminfo");
  std::string key, unit;
  int64_t kib = 0;
  while (f >> key >> kib >> unit) {
    if (key == "MemTotal:") return kib * 1024;
  }
  return 0;
}

TEST(PopulateTest, AvailableMemoryIsSomeOfTheMachines) {
  const int64_t total = MemTotalBytes();
  ASSERT_GT(total, 0);
  const int64_t available = AvailableMemoryBytes();
  EXPECT_GT(available, 0);
  EXPECT_LE(available, total);
}

TEST(PopulateTest, PagesAreMappedWithoutChangingAByte) {
  constexpr int64_t kBytes = 8 << 20;
  void* p = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  auto* bytes = static_cast<uint8_t*>(p);
  bytes[12345] = 7;  // one page already written: its byte must stay
  ASSERT_TRUE(PopulateWritable(bytes, kBytes).ok());
  rusage before{};
  getrusage(RUSAGE_THREAD, &before);
  for (int64_t i = 0; i < kBytes; i += 4096) bytes[i + 1] = 1;
  rusage after{};
  getrusage(RUSAGE_THREAD, &after);
  if (!testing::kSanitized) {  // a sanitizer's shadow memory faults too
    EXPECT_LT(after.ru_minflt - before.ru_minflt, 16) << "of " << kBytes / 4096 << " pages";
  }
  EXPECT_EQ(bytes[12345], 7);
  EXPECT_EQ(bytes[4096 * 100], 0);

  const std::atomic<bool> stop{true};
  EXPECT_TRUE(absl::IsCancelled(PopulateWritable(bytes, kBytes, &stop)));
  munmap(p, kBytes);
}

}  // namespace
}  // namespace tandem
