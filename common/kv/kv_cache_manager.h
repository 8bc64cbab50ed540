#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/kv/block_hash.h"
#include "common/kv/block_memory.h"
#include "common/kv/block_pool.h"
#include "common/kv/kv_cache_stats.h"
#include "common/kv/kv_events.h"
#include "common/kv/kv_layout.h"

namespace tandem::kv {

// A mixed-precision cache (kv_cache.dtype mixed): blocks of the layout's dtype (wide) for the
// tokens attention leans on, int8 blocks for the rest. A block stays wide while it holds an
// attention-sink token or one of the last `window_tokens` tokens; once a block has fallen behind
// the window it is requantized into an int8 block (see CommitTokens).
struct MixedKvOptions {
  int64_t narrow_blocks = 0;  // int8 blocks after the num_blocks wide ones; 0: a uniform cache
  int sink_tokens = 4;        // the first tokens of every sequence: always wide
  int window_tokens = 64;     // the most recent tokens: wide
};

// One sequence of `context` tokens in a mixed cache, once its blocks behind the window are
// requantized: how many tokens are held in the wide dtype and how many in int8, and their bytes.
struct MixedKvFootprint {
  int64_t wide_tokens = 0;
  int64_t narrow_tokens = 0;
  uint64_t bytes = 0;
};
MixedKvFootprint MixedFootprint(const KvLayout& wide, const MixedKvOptions& mixed, int64_t context);

struct KvCacheOptions {
  KvLayout layout;
  int64_t num_blocks = 0;
  MixedKvOptions mixed;
  std::string model_id;  // part of every block hash
  std::string weight_quantization;  // also part of it (HashModelId); empty for float weights
  uint64_t weights_fingerprint = 0;  // also part of it; 0: none (model::ModelWeights::fingerprint)
  bool enable_prefix_caching = true;
  // Where the blocks live (BlockMemory); null: host memory. Must outlive the manager.
  BlockMemory* memory = nullptr;
};

// Outcome of inserting externally produced blocks (see ImportBlocks in kv_transfer.h).
struct ImportResult {
  int64_t imported = 0;         // blocks copied in and indexed as cached
  int64_t already_present = 0;  // blocks skipped because their hash was already indexed
};

// Paged KV cache: per-sequence block tables over a BlockPool, plus the prefix index
// (block hash -> block) whose unreferenced blocks form an LRU cache.
//
// Not thread-safe, like BlockPool: the engine-loop thread owns it, and every other thread reaches
// it through a task posted to that loop (export, import, prefix reports, stats). Block
// *contents* follow the same rule: the engine writes a sequence's blocks only between Reserve
// and CommitTokens, and a block is shared (prefix hit) only after it was committed, i.e. is
// read-only.
class KvCacheManager {
 public:
  // InvalidArgument on bad geometry or absurd sizes, ResourceExhausted if allocation fails.
  static absl::StatusOr<std::unique_ptr<KvCacheManager>> Create(const KvCacheOptions& options);

  KvCacheManager(const KvCacheManager&) = delete;
  KvCacheManager& operator=(const KvCacheManager&) = delete;

  const KvLayout& layout() const { return layout_; }
  const std::string& model_id() const { return model_id_; }
  uint64_t model_hash() const { return model_hash_; }
  bool prefix_caching_enabled() const { return prefix_caching_; }
  // Start of block memory: block b lives at pool_base() + b * layout().BlockBytes() (a uniform
  // cache; arena() says where the blocks of any cache are).
  uint8_t* pool_base() { return arena_.base; }
  const KvArena& arena() const { return arena_; }
  // Bytes of block memory the pool holds.
  size_t pool_bytes() const { return pool_->bytes(); }
  bool mixed() const { return mixed_.narrow_blocks > 0; }

  // Host access to whole blocks, for code outside the kernels (export, import, narrowing,
  // eviction's key means). In host memory these are the blocks themselves; in device memory
  // the bytes cross through `scratch`. ReadableBlock's pointer is valid until the next call
  // with the same scratch or the next write to the block.
  const uint8_t* ReadableBlock(int32_t id, std::vector<uint8_t>& scratch) const;
  // Block `id` = `src` (bytes of layout `from`, the same geometry), converted to the block's
  // own dtype.
  void WriteBlock(int32_t id, const uint8_t* src, const KvLayout& from);

  // Registers `seq_id` and maps the longest cached prefix of `prompt` made of full blocks, but
  // never the whole prompt (at most (prompt.size()-1)/block_size blocks), so at least one token is
  // left to compute. Each lookup counts a hit, the first failing one a miss. Returns the number
  // of prompt tokens whose KV is present (a multiple of block_size). AlreadyExists if registered.
  // A nonzero `salt` starts the sequence's hash chain (HashPrefixBlocks), so its blocks are
  // shared only with sequences of the same salt: a cache salt, or KV that depends on more than
  // the prefix (a pruned prefill). Without `reuse` nothing is looked up (nor counted): the
  // sequence computes its whole prompt, whose blocks still enter the index.
  absl::StatusOr<int> AddSequence(int64_t seq_id, std::span<const int32_t> prompt,
                                  BlockHash salt = 0, bool reuse = true);

  // Grows the block table to cover positions [0, num_tokens): free blocks first, then LRU
  // eviction of cached blocks. ResourceExhausted (nothing changed) if there are not enough;
  // NotFound for an unknown sequence.
  absl::Status Reserve(int64_t seq_id, int num_tokens);

  // True if `num_new_blocks` more blocks could be obtained now (free + evictable).
  bool CanAllocate(int64_t num_new_blocks) const;
  int64_t NumAvailableBlocks() const;

  // Call after the KV of tokens[0, num_computed) is written. Every newly full block gets its
  // chained hash and enters the prefix index, unless that hash is already indexed (then the block
  // stays unindexed and is freed, not cached, on release). `tokens` is the full token list so far.
  // In a mixed cache, each wide block of the sequence's own (not shared) that is now wholly
  // behind the window and past the sinks is requantized into a fresh int8 block, which takes its
  // place in the table and in the prefix index; with no int8 block to be had it stays wide.
  void CommitTokens(int64_t seq_id, std::span<const int32_t> tokens, int num_computed);

  // Drops blocks [first, last) of the sequence's table (a sliding or elastic window): each live
  // one is released and its entry becomes kNoBlock, which attention skips; the positions keep
  // their numbers. Returns how many were live. The range is clamped to the table. Blocks the
  // sequence fills afterwards stay out of the prefix index (their KV saw a partial context).
  int EvictBlocks(int64_t seq_id, int first, int last);

  // Releases every block of the sequence, last block first, so that within a sequence the tail is
  // evicted before the head. Unknown ids are ignored.
  void FreeSequence(int64_t seq_id);

  // Undoes an AddSequence whose admission could not go ahead (its Reserve failed): frees the
  // blocks and takes its lookups back out of the hit/miss counts, so that retrying the
  // admission later counts the prompt once. Unknown ids are ignored.
  void CancelSequence(int64_t seq_id);

  // Ids of the indexed blocks for `hashes`, in order, up to the first hash not indexed. No
  // refcount or statistic changes: the ids stay valid until the next allocation, which is how
  // a prefill worker exports a finished prompt's blocks before its engine steps again.
  std::vector<int32_t> FindCachedPrefix(std::span<const BlockHash> hashes) const;

  std::vector<int32_t> BlockTable(int64_t seq_id) const;  // copy; empty if unknown
  // Valid until the sequence is freed or its table grows; nullptr if unknown.
  const int32_t* BlockTableData(int64_t seq_id) const;
  // Number of blocks in the sequence's table (0 if unknown).
  int NumBlocks(int64_t seq_id) const;

  KvCacheStats Stats() const;
  // Drops every cached (evictable) block to free and out of the index. Blocks in use stay.
  void ResetPrefixCache();
  // Every hash in the prefix index (blocks a new prompt could reuse), in no particular order:
  // the full snapshot a worker reports to the router's prefix-aware routing.
  std::vector<BlockHash> IndexedHashes() const;
  // Every change to the prefix index since, in order: what a worker reports between snapshots.
  const KvEventLog& events() const { return events_; }

  // --- Support for kv_transfer and tests. ---

  // Refcount of a block (-1 for an invalid id).
  int32_t BlockRefCount(int32_t block_id) const;
  // True if `hash` is in the prefix index.
  bool ContainsHash(BlockHash hash) const;
  // InvalidArgument if an id is out of range, FailedPrecondition if a block is free (holds no
  // KV anyone could want to export).
  absl::Status CheckBlocksLive(std::span<const int32_t> block_ids) const;
  // Copies `block_data[i]` (in `data_layout`, the cache's own if omitted; of the same geometry)
  // into fresh blocks indexed under `hashes[i]` as cached (refcount 0, evictable). A mixed cache
  // keeps int8 data in int8 blocks where it can, and converts otherwise. Hashes already indexed (or
  // repeated) are skipped. ResourceExhausted (nothing changed) if the new blocks do not fit;
  // FailedPrecondition if prefix caching is disabled.
  absl::StatusOr<ImportResult> InsertCachedBlocks(
      std::span<const BlockHash> hashes, std::span<const uint8_t* const> block_data,
      const std::optional<KvLayout>& data_layout = std::nullopt);

 private:
  struct Sequence {
    std::vector<int32_t> blocks;
    // Chained hashes of the first hashes.size() (full, committed) blocks.
    std::vector<BlockHash> hashes;
    BlockHash salt = 0;   // the chain's start
    int lookup_hits = 0;  // what AddSequence counted, for CancelSequence
    int lookup_misses = 0;
    size_t next_narrow = 0;  // blocks before this one are int8, evicted or sinks (mixed cache)
    // Set by EvictBlocks: the KV of later tokens was computed without the evicted ones, so no
    // later block may enter the prefix index.
    bool evicted = false;
  };

  KvCacheManager(const KvCacheOptions& options, std::unique_ptr<BlockPool> pool);

  // Allocates one block, evicting if needed, of `kind` if one can be had, else (unless
  // `only_kind`) of the other. kNoBlock if none; callers of the default have checked availability.
  int32_t AllocateBlock(BlockKind kind = BlockKind::kWide, bool only_kind = false);
  // Mixed cache: requantizes the sequence's wide blocks that fell behind the window.
  void NarrowOldBlocks(Sequence& seq, int num_computed);

  const KvLayout layout_;
  const std::string model_id_;
  const uint64_t model_hash_;
  const bool prefix_caching_;
  const MixedKvOptions mixed_;
  const KvArena arena_;  // copy of pool_->arena()

  const std::unique_ptr<BlockPool> pool_;
  // Host copies of blocks in device memory (ReadableBlock, WriteBlock), reused.
  std::vector<uint8_t> read_scratch_, write_scratch_;
  absl::flat_hash_map<BlockHash, int32_t> index_;
  absl::flat_hash_map<int64_t, Sequence> seqs_;
  int64_t hits_ = 0;
  int64_t misses_ = 0;
  int64_t evictions_ = 0;
  int64_t narrowed_ = 0;
  int64_t window_evicted_ = 0;
  KvEventLog events_;
};

}  // namespace tandem::kv
