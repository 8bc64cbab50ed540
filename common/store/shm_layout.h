// The layout of a shard's shared-memory arena file: a header page the shard writes once, then
// block bytes. The shard creates it (shm_arena.h); co-located clients map it
// (common/store/shm_mapping.h) and check the header names the shard they attached to.
#pragma once

#include <cstdint>

namespace tandem::store {

inline constexpr uint64_t kShmMagic = 0x314d48534d444e54;  // "TNDMSHM1", little-endian
inline constexpr int64_t kShmHeaderBytes = 4096;           // block offsets start after it

struct ShmHeader {
  uint64_t magic;
  uint64_t instance_id;  // random per shard process; every shared-memory RPC carries it
  int64_t file_bytes;    // header included
};

}  // namespace tandem::store
