#include "cache_store/shm_arena.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "common/util/log.h"
#include "common/util/populate.h"

namespace tandem::cache_store {
namespace {

constexpr int64_t kPageBytes = 4096;

absl::Status Errno(const char* what) {
  return absl::UnavailableError(absl::StrCat("shared memory: ", what, ": ", std::strerror(errno)));
}

uint64_t NewInstanceId() {
  absl::BitGen gen;
  uint64_t id = 0;
  while (id == 0) id = absl::Uniform<uint64_t>(gen);
  return id;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShmArena>> ShmArena::Create(int64_t data_bytes, bool preallocate) {
  if (data_bytes <= 0) return absl::InvalidArgumentError("shared memory: empty arena");
  const int64_t file_bytes =
      store::kShmHeaderBytes + (data_bytes + kPageBytes - 1) / kPageBytes * kPageBytes;
  // Refused here rather than found out by the OOM killer, which may pick another process.
  if (preallocate) {
    if (const int64_t available = AvailableMemoryBytes(); file_bytes > available) {
      return absl::ResourceExhaustedError(
          absl::StrCat("shared memory: cache_store.preallocate needs ", file_bytes >> 20,
                       " MiB for the arena, and ", available >> 20,
                       " MiB are available (MemAvailable, or the memory cgroup's limit)"));
    }
  }
  const int fd = memfd_create("tandem-cache-store", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return Errno("memfd_create");
  // Owner-only, like /proc/PID/fd through which clients open it: other users get nothing.
  if (fchmod(fd, 0600) != 0) {
    absl::Status s = Errno("fchmod");
    close(fd);
    return s;
  }
  if (ftruncate(fd, file_bytes) != 0) {
    absl::Status s = Errno("ftruncate");
    close(fd);
    return s;
  }
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    absl::Status s = Errno("sealing the size");
    close(fd);
    return s;
  }
  void* base = mmap(nullptr, file_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    absl::Status s = Errno("mmap");
    close(fd);
    return s;
  }
  madvise(base, file_bytes, MADV_HUGEPAGE);  // a hint; shmem THP may be off
  std::string path = absl::StrCat("/proc/", getpid(), "/fd/", fd);
  // Clients reach the file through /proc; check that this works before offering it.
  const int probe = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (probe < 0) {
    absl::Status s = Errno(path.c_str());
    munmap(base, file_bytes);
    close(fd);
    return s;
  }
  close(probe);
  if (preallocate) {
    const auto start = std::chrono::steady_clock::now();
    absl::Status s = PopulateWritable(static_cast<uint8_t*>(base), file_bytes);
    if (absl::IsUnimplemented(s)) {
      // An older kernel: write the pages instead (zeros over zeros), which no client sees yet.
      std::memset(base, 0, static_cast<size_t>(file_bytes));
      s = absl::OkStatus();
    }
    if (!s.ok()) {
      munmap(base, file_bytes);
      close(fd);
      return absl::ResourceExhaustedError(absl::StrCat(
          "shared memory: cache_store.preallocate could not allocate the arena: ", s.message()));
    }
    Log(LogLevel::kInfo, "cache-store",
        absl::StrCat("shared memory: preallocated the ", file_bytes >> 20, " MiB arena in ",
                     std::chrono::duration_cast<std::chrono::milliseconds>(
                         std::chrono::steady_clock::now() - start)
                         .count(),
                     " ms"));
  }
  const uint64_t instance_id = NewInstanceId();
  store::ShmHeader header{
      .magic = store::kShmMagic, .instance_id = instance_id, .file_bytes = file_bytes};
  std::memcpy(base, &header, sizeof(header));
  return std::unique_ptr<ShmArena>(new ShmArena(fd, static_cast<uint8_t*>(base), file_bytes,
                                                instance_id, std::move(path), preallocate));
}

ShmArena::~ShmArena() {
  munmap(base_, file_bytes_);
  close(fd_);
}

}  // namespace tandem::cache_store
