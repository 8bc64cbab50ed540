#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/kv/block_hash.h"
#include "common/kv/block_memory.h"
#include "common/kv/kv_layout.h"

namespace tandem::kv {

// Upper bounds that keep every size computation far from overflow and reject configs or wire
// input that cannot be meant (InvalidArgument rather than a failed multi-terabyte allocation).
inline constexpr int kMaxLayers = 4096;
inline constexpr int kMaxKvHeads = 4096;
inline constexpr int kMaxHeadDim = 65536;
inline constexpr int kMaxBlockSize = 65536;
inline constexpr size_t kMaxBlockBytes = size_t{1} << 30;  // 1 GiB per block
inline constexpr size_t kMaxPoolBytes = size_t{1} << 40;   // 1 TiB per pool

// OK if every dimension is positive and within the bounds above; InvalidArgument naming the field
// otherwise.
absl::Status ValidateKvLayout(const KvLayout& layout);

// Metadata of one block; the bytes live in the BlockPool. A block is in exactly one state:
//   free:   ref_count == 0, !indexed, on the free list;
//   used:   ref_count > 0 (indexed or not), on no list;
//   cached: ref_count == 0, indexed, on the LRU list (evictable).
struct KvBlock {
  int32_t ref_count = 0;
  // True while this block is the prefix index's entry for `hash`.
  bool indexed = false;
  BlockHash hash = 0;
  // Intrusive LRU links (block ids), valid only while cached.
  int32_t lru_prev = kNoBlock;
  int32_t lru_next = kNoBlock;
};

// The two kinds of block in a mixed-precision pool: `layout`'s dtype, and int8.
enum class BlockKind : uint8_t { kWide = 0, kNarrow = 1 };

// Owns the block memory (one 64-byte-aligned, zeroed mapping of a BlockMemory), the block metadata,
// the free lists and the LRU lists of cached blocks, one of each per kind. Every operation is O(1).
// Not thread-safe: the KvCacheManager serialises access under its mutex. It does not know about
// the prefix index; the caller drops the index entry of a block it evicts.
class BlockPool {
 public:
  // `num_blocks` blocks of `layout`, then `num_narrow` int8 blocks of the same geometry (a
  // mixed-precision pool; see KvArena), in `memory` (host memory when null; it must outlive
  // the pool). InvalidArgument on bad geometry or sizes, ResourceExhausted if the memory
  // cannot be had.
  static absl::StatusOr<std::unique_ptr<BlockPool>> Create(const KvLayout& layout,
                                                           int64_t num_blocks,
                                                           int64_t num_narrow = 0,
                                                           BlockMemory* memory = nullptr);
  ~BlockPool();
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  const KvLayout& layout() const { return arena_.layout; }
  const KvArena& arena() const { return arena_; }
  // All blocks, of both kinds.
  int64_t num_blocks() const { return static_cast<int64_t>(blocks_.size()); }
  int64_t num_narrow() const { return num_blocks() - num_wide(); }
  int64_t num_wide() const { return std::min<int64_t>(arena_.num_wide, num_blocks()); }
  BlockKind KindOf(int32_t id) const {
    return arena_.IsNarrow(id) ? BlockKind::kNarrow : BlockKind::kWide;
  }
  int64_t num_free() const {
    return static_cast<int64_t>(free_lists_[0].size() + free_lists_[1].size());
  }
  int64_t num_free(BlockKind kind) const {
    return static_cast<int64_t>(free_lists_[static_cast<int>(kind)].size());
  }
  int64_t num_cached() const { return lru_[0].size + lru_[1].size; }
  int64_t num_used() const { return num_used_; }
  // Blocks an allocation can obtain now: free + evictable.
  int64_t num_available() const { return num_free() + num_cached(); }

  uint8_t* base() const { return arena_.base; }
  BlockMemory& memory() const { return memory_; }
  size_t bytes() const { return mapped_bytes_; }
  uint8_t* BlockData(int32_t id) const { return arena_.Block(id); }
  size_t BlockBytes(int32_t id) const { return arena_.LayoutOf(id).BlockBytes(); }
  const KvBlock& block(int32_t id) const { return blocks_[id]; }
  bool IsValidId(int64_t id) const { return id >= 0 && id < num_blocks(); }

  // Takes a free block, else evicts the least recently released cached block, of kind `kind`
  // first and then, unless `only_kind`, of the other kind. The block comes back with ref_count 1
  // and not indexed. If a cached block was evicted, `*evicted_hash` gets its hash (the caller
  // must drop it from its index) and `*evicted` is true. Returns kNoBlock if nothing is
  // available.
  int32_t Allocate(bool* evicted, BlockHash* evicted_hash, BlockKind kind = BlockKind::kWide,
                   bool only_kind = false);
  // ref_count++; a cached block leaves the LRU list (becomes used).
  void Acquire(int32_t id);
  // ref_count--; at 0 an indexed block becomes cached (LRU tail = most recent), else free.
  void Release(int32_t id);
  // Marks a used block as the index entry for `hash` (so it is cached, not freed, at refcount 0).
  void SetIndexed(int32_t id, BlockHash hash);
  // Makes a used, indexed block an ordinary one again (freed, not cached, at refcount 0): its
  // index entry moved to another block.
  void ClearIndexed(int32_t id);
  // Oldest cached block (of either kind), or kNoBlock.
  int32_t LruHead() const { return lru_[0].head != kNoBlock ? lru_[0].head : lru_[1].head; }
  // Turns a cached block into a free one (not indexed any more). Returns its hash.
  BlockHash DropCached(int32_t id);

 private:
  struct Lru {
    int32_t head = kNoBlock;  // least recently released, evicted first
    int32_t tail = kNoBlock;
    int64_t size = 0;
  };

  BlockPool(const KvArena& arena, int64_t num_blocks, size_t mapped_bytes, BlockMemory& memory);
  // A free block of `kind`, else its oldest cached one (evicted); kNoBlock if neither.
  int32_t Take(BlockKind kind, bool* evicted, BlockHash* evicted_hash);
  Lru& LruOf(int32_t id) { return lru_[static_cast<int>(KindOf(id))]; }
  std::vector<int32_t>& FreeListOf(int32_t id) { return free_lists_[static_cast<int>(KindOf(id))]; }
  void LruUnlink(int32_t id);
  void LruPushBack(int32_t id);

  const KvArena arena_;
  const size_t mapped_bytes_;
  BlockMemory& memory_;
  std::vector<KvBlock> blocks_;
  std::vector<int32_t> free_lists_[2];  // per kind; stacks, back() is handed out next
  Lru lru_[2];                          // per kind
  int64_t num_used_ = 0;
};

}  // namespace tandem::kv
