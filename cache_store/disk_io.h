// The file operations the disk tier (disk_tier.h) performs, behind a seam so tests can make any
// one of them fail, tear or run out of space (tests/unit/cache_store/faulty_disk.h) and then
// reopen the directory as a restarted shard would.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem::cache_store {

// One open file. Positional reads and writes may run concurrently from several threads.
class DiskFile {
 public:
  virtual ~DiskFile() = default;
  // All of `data` at `offset`; an error (ResourceExhausted for ENOSPC) may leave a prefix written.
  virtual absl::Status Write(std::span<const uint8_t> data, int64_t offset) = 0;
  // Exactly `data.size()` bytes at `offset`; OutOfRange if the file ends before.
  virtual absl::Status Read(std::span<uint8_t> data, int64_t offset) = 0;
  virtual absl::Status Sync() = 0;  // fdatasync
  virtual absl::Status Truncate(int64_t size) = 0;
  // Reserves `size` bytes of disk for the file (fallocate); ResourceExhausted when full.
  virtual absl::Status Preallocate(int64_t size) = 0;
  virtual absl::StatusOr<int64_t> Size() = 0;
};

class DiskFs {
 public:
  virtual ~DiskFs() = default;
  // Opens `path` read-write, creating it (empty) if absent.
  virtual absl::StatusOr<std::unique_ptr<DiskFile>> Open(const std::string& path) = 0;
  // Atomically replaces `to` with `from`, then syncs the directory holding them.
  virtual absl::Status Replace(const std::string& from, const std::string& to) = 0;
  virtual absl::Status CreateDirectories(const std::string& path) = 0;
  // Deletes a file; OK if it does not exist.
  virtual absl::Status Remove(const std::string& path) = 0;
};

// The real file system (POSIX pread/pwrite/fdatasync/fallocate). One instance serves every tier.
DiskFs& PosixDiskFs();

}  // namespace tandem::cache_store
