#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/kv/block_hash.h"
#include "common/kv/kv_cache_manager.h"
#include "common/kv/kv_layout.h"

namespace tandem::kv {

// What a block's bytes mean. Prefill and decode must agree on all of it, so it travels with the
// data and is checked on import.
struct KvDescriptor {
  std::string model_id;
  KvLayout layout;  // of the blocks that follow
  // The sender's cache is mixed-precision: its blocks are each of `layout`'s wide dtype or int8
  // (the receiver must be a mixed cache of the same wide dtype).
  bool mixed = false;

  bool operator==(const KvDescriptor&) const = default;
};

KvDescriptor DescriptorOf(const KvCacheManager& manager);

// Wire format, all integers little-endian:
//   "TKVB"  u32 version (=1)
//   u32 model_id_len, model_id bytes
//   u32 dtype, u32 block_size, u32 num_layers, u32 num_kv_heads, u32 head_dim
//     (dtype: the DType of the blocks, | kMixedKvFlag if the sender's cache is mixed-precision)
//   u64 block_bytes (must equal layout.BlockBytes()), u64 num_blocks
//   num_blocks x { u64 hash, block_bytes bytes }
//   u64 XXH3-64 of every byte before it
inline constexpr char kKvTransferMagic[4] = {'T', 'K', 'V', 'B'};
inline constexpr uint32_t kKvTransferVersion = 1;
inline constexpr uint32_t kMaxModelIdBytes = 4096;
inline constexpr uint32_t kMixedKvFlag = 0x100;

// Serialises the given blocks of `manager` (in order) with their chained hashes and the manager's
// descriptor. In a mixed cache the blocks travel in the first one's dtype (one block per call
// keeps each block's own). InvalidArgument if the spans differ in length or an id is out of range,
// FailedPrecondition if a block is free.
// The bytes ExportBlocks writes for `blocks` blocks of `block_bytes` each under `desc`.
size_t ExportedBytes(const KvDescriptor& desc, size_t block_bytes, size_t blocks);

absl::StatusOr<std::string> ExportBlocks(KvCacheManager& manager,
                                         std::span<const int32_t> block_ids,
                                         std::span<const BlockHash> hashes);

// Validates `bytes` completely (InvalidArgument for malformed or truncated input, DataLoss for a
// checksum mismatch, FailedPrecondition naming the field if the descriptor differs from the
// manager's), then copies the blocks into the manager as cached (refcount 0, evictable) prefix
// blocks, so a later AddSequence with the same prompt hits them. Hashes already indexed are
// skipped and counted. ResourceExhausted if they do not fit. On any error nothing changes.
absl::StatusOr<ImportResult> ImportBlocks(KvCacheManager& manager, std::string_view bytes);

}  // namespace tandem::kv
