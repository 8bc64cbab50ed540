#include "common/util/populate.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14
#endif

namespace tandem {
namespace {

// The number a file starts with ("max" and anything else unreadable: none).
std::optional<int64_t> ReadNumber(const char* path) {
  std::ifstream f(path);
  std::string word;
  int64_t n = 0;
  if (!(f >> word) || !absl::SimpleAtoi(word, &n)) return std::nullopt;
  return n;
}

// MemAvailable from /proc/meminfo, in bytes.
std::optional<int64_t> MemAvailable() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (f >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return std::nullopt;
}

}  // namespace

absl::Status PopulateWritable(uint8_t* base, int64_t bytes, const std::atomic<bool>* stop) {
  // Steps of 32 MiB: about 20 ms each where a page fault costs 2 us (docs/benchmarks.md), so a
  // stop waits no longer than that.
  constexpr int64_t kStep = int64_t{32} << 20;
  for (int64_t done = 0; done < bytes; done += kStep) {
    if (stop != nullptr && stop->load(std::memory_order_relaxed)) {
      return absl::CancelledError("populating memory: stopped");
    }
    if (madvise(base + done, static_cast<size_t>(std::min(kStep, bytes - done)),
                MADV_POPULATE_WRITE) != 0) {
      const int err = errno;
      const std::string what =
          absl::StrCat("mapping ", bytes >> 20, " MiB in advance: ", std::strerror(err));
      if (err == EINVAL) return absl::UnimplementedError(what);
      if (err == ENOMEM || err == EFAULT) return absl::ResourceExhaustedError(what);
      return absl::InternalError(what);
    }
  }
  return absl::OkStatus();
}

int64_t AvailableMemoryBytes() {
  int64_t available = MemAvailable().value_or(std::numeric_limits<int64_t>::max());
  const std::pair<const char*, const char*> cgroups[] = {
      {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"},
      {"/sys/fs/cgroup/memory/memory.limit_in_bytes",
       "/sys/fs/cgroup/memory/memory.usage_in_bytes"}};
  for (const auto& [limit_path, usage_path] : cgroups) {
    const std::optional<int64_t> limit = ReadNumber(limit_path);
    const std::optional<int64_t> usage = ReadNumber(usage_path);
    if (limit && usage) available = std::min(available, std::max<int64_t>(0, *limit - *usage));
  }
  return available;
}

}  // namespace tandem
