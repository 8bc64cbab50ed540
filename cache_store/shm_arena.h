// A shard's block memory as a sealed memfd mapped shared, so co-located clients can map the
// same pages and copy block bytes without the socket. The file has no name in any file system:
// it disappears with the last process that maps it, so a crashed shard leaves nothing in
// /dev/shm. Clients open it as /proc/<shard pid>/fd/<fd>. Its size is sealed, so a client can
// never be made to fault by the file shrinking under its mapping.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "common/store/shm_layout.h"

namespace tandem::cache_store {

class ShmArena {
 public:
  // `data_bytes` of block memory (rounded up to pages) after the header page. Unavailable when
  // the kernel refuses (no memfd, no /proc): the store then keeps blocks in private memory.
  // `preallocate` allocates and maps every page now (cache_store.preallocate), so that no write
  // to a block faults one in; ResourceExhausted when the memory is not there.
  static absl::StatusOr<std::unique_ptr<ShmArena>> Create(int64_t data_bytes,
                                                          bool preallocate = false);
  ~ShmArena();
  ShmArena(const ShmArena&) = delete;
  ShmArena& operator=(const ShmArena&) = delete;

  const std::string& path() const { return path_; }
  uint64_t instance_id() const { return instance_id_; }
  int64_t file_bytes() const { return file_bytes_; }
  // Whether every page was allocated at creation: clients then map all of it too.
  bool preallocated() const { return preallocated_; }
  // Block memory: [data(), data() + data_bytes()) is file range [store::kShmHeaderBytes,
  // file_bytes).
  uint8_t* data() const { return base_ + store::kShmHeaderBytes; }
  int64_t data_bytes() const { return file_bytes_ - store::kShmHeaderBytes; }
  // The file offset of `p`, a pointer into block memory.
  int64_t FileOffset(const uint8_t* p) const { return p - base_; }

 private:
  ShmArena(int fd, uint8_t* base, int64_t file_bytes, uint64_t instance_id, std::string path,
           bool preallocated)
      : fd_(fd),
        base_(base),
        file_bytes_(file_bytes),
        instance_id_(instance_id),
        path_(std::move(path)),
        preallocated_(preallocated) {}

  const int fd_;
  uint8_t* const base_;
  const int64_t file_bytes_;
  const uint64_t instance_id_;
  const std::string path_;
  const bool preallocated_;
};

}  // namespace tandem::cache_store
