// The memory of one cache-store shard: immutable KV blocks keyed by their chained hash, in a
// capacity-limited pool with LRU eviction. The gRPC service (cache_store_service.h) is a thin
// layer over it.
//
// Blocks are written in two phases: BeginPut reserves the space and hands the writer a
// PendingPut it fills chunk by chunk (or, through the shared arena, in place); only Commit makes
// the block visible, so no reader sees a partial block, and a writer that disappears (its
// PendingPut destroyed) releases the space. Readers get a BlockRef that pins the block: pinned
// and pending blocks are never evicted.
//
// A block may have several writers at once, each in its own space: the first to commit
// publishes it, and a later commit frees its copy. So a writer with the bytes in hand never waits
// on, or trusts, another writer that may be slow (a prefill still computing into space reserved
// ahead) or gone; one that reserves before its bytes exist can leave such blocks to the other
// (WhilePending::kSkip).
//
// Block bytes live in a BlockMemory: by default a shared-memory arena that co-located clients
// map (the node-local fast path; arena() names it), else private heap memory.
//
// With a disk tier (disk_tier.h), every committed block is also written to disk in the
// background (write-through, oldest first, by the store's spill thread), so a block evicted from
// memory, or lost with the process, is still there; a block only in memory when it is evicted
// (the disk fell behind) is simply gone. A Get that misses memory and finds the block on disk
// reads it back (Promote does so for many blocks at once, in parallel) and serves it from
// memory: a slower hit, not a miss. BeginPut of a block on disk is AlreadyExists.
//
// Thread-safe: every method may be called from any thread. PendingPut::Append touches only the
// writer's own reserved bytes and takes no lock. BlockRefs and PendingPuts must not outlive the
// store.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/node_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "cache_store/block_memory.h"
#include "cache_store/disk_tier.h"
#include "common/store/block_checksum.h"
#include "common/util/work_queue.h"

namespace tandem::cache_store {

struct BlockStoreOptions {
  int64_t capacity_bytes = int64_t{1} << 30;
  int64_t max_block_bytes = int64_t{1} << 30;  // larger puts are InvalidArgument
  // Keep blocks in a shared-memory arena co-located clients can map. If the kernel refuses one
  // the store logs why and keeps them in private memory (clients then use the stream).
  bool shared_memory = true;
  // Allocate every page of the shared-memory arena at creation, and have clients map all of it
  // when they attach (cache_store.preallocate): no block write then faults a page in. Creation
  // fails when the memory is not there. Private memory is allocated block by block regardless.
  bool preallocate = false;
  // The disk tier behind the memory; an empty directory: none.
  DiskTierOptions disk{};
  // Blocks the spill thread writes per group commit (and at most an eighth of the capacity).
  int spill_batch_blocks = 16;
};

// Counters since creation and the current occupancy.
struct BlockStoreStats {
  int64_t capacity_bytes = 0;
  int64_t used_bytes = 0;     // committed blocks plus space reserved by pending puts
  int64_t blocks = 0;         // committed blocks
  int64_t pending_puts = 0;   // puts begun and neither committed nor abandoned
  int64_t duplicate_puts = 0;  // committed after another writer of the block had (copy freed)
  int64_t pinned_blocks = 0;  // committed blocks with at least one live BlockRef
  int64_t puts = 0;           // committed puts
  int64_t put_skipped = 0;    // BeginPut of a block already stored (or, kSkip, being written)
  int64_t put_aborted = 0;    // pending puts abandoned or failed at Commit
  int64_t hits = 0;           // Get calls that found their block
  int64_t misses = 0;         // Get calls that did not
  int64_t memory_hits = 0;    // Get calls served from memory
  int64_t memory_misses = 0;  // Get calls that did not find the block in memory (so hits -
                              // memory_hits of them were served from disk)
  int64_t evictions = 0;
  int64_t corrupt = 0;  // blocks found changed after their commit, and dropped
  // With a disk tier:
  bool has_disk = false;
  int64_t spilled = 0;            // blocks written to the disk tier
  int64_t evicted_unspilled = 0;  // evicted from memory before the spill thread wrote them
  int64_t promoted = 0;           // blocks read back from disk into memory
  int64_t disk_misses = 0;        // Get calls that missed memory and disk
  DiskTierStats disk;
};

// The checksum a reader wants with its block: XXH32 for the stream, XXH3-64 for shared memory.
enum class ChecksumKind { kXxh32, kXxh3 };

// What BeginPut does with a block another writer has begun and not committed.
enum class WhilePending {
  kWriteToo,  // write it as well (a writer with the bytes in hand: it reports what is stored)
  kSkip,      // leave it to the other writer (space reserved before the bytes exist)
};

class BlockStore;

// A pinned, committed block. Movable; unpins on destruction.
class BlockRef {
 public:
  BlockRef() = default;
  BlockRef(BlockRef&& other) noexcept { *this = std::move(other); }
  BlockRef& operator=(BlockRef&& other) noexcept;
  ~BlockRef() { Reset(); }

  std::span<const uint8_t> data() const { return data_; }
  uint32_t checksum() const { return checksum_; }      // XXH32; set when Get asked for it
  uint64_t checksum64() const { return checksum64_; }  // XXH3-64; set when Get asked for it
  uint64_t hash() const { return hash_; }
  void Reset();

 private:
  friend class BlockStore;
  BlockStore* store_ = nullptr;
  uint64_t hash_ = 0;
  uint32_t checksum_ = 0;
  uint64_t checksum64_ = 0;
  std::span<const uint8_t> data_;
};

// A block being written. Movable; abandons the put (releasing its space) unless committed.
class PendingPut {
 public:
  PendingPut(PendingPut&& other) noexcept { *this = std::move(other); }
  PendingPut& operator=(PendingPut&& other) noexcept;
  ~PendingPut() { Abandon(); }

  uint64_t hash() const { return hash_; }
  int64_t size() const { return static_cast<int64_t>(data_.size()); }
  int64_t written() const { return written_; }
  // The reserved bytes, for writers that fill them in place (through the shared arena).
  std::span<uint8_t> data() const { return data_; }

  // OutOfRange (nothing written) past the size declared at BeginPut.
  absl::Status Append(std::span<const uint8_t> bytes);
  // Publishes the block (or, if another writer published it first, frees this copy: the block
  // is stored either way). FailedPrecondition if bytes are missing, DataLoss if the checksum
  // given at BeginPut does not match; either way the put is abandoned.
  absl::Status Commit();
  // Publishes bytes written into data() directly with the writer's XXH3-64 (the checksum given
  // at BeginPut is not used). With `verify`, the bytes are checked against it first: DataLoss,
  // and the put is abandoned, on a mismatch. Without, readers catch a mismatch (see Get).
  absl::Status CommitInPlace(uint64_t checksum64, bool verify = true);

 private:
  friend class BlockStore;
  PendingPut(BlockStore* store, uint64_t hash, std::span<uint8_t> data, uint32_t checksum)
      : store_(store), hash_(hash), checksum_(checksum), data_(data) {}
  void Abandon();

  BlockStore* store_ = nullptr;
  uint64_t hash_ = 0;
  uint32_t checksum_ = 0;
  bool from_disk_ = false;  // a promotion: the block is on disk already
  int64_t written_ = 0;
  std::span<uint8_t> data_;  // reserved in the store's memory
};

class BlockStore {
 public:
  // InvalidArgument for a non-positive capacity or block limit; the disk tier's Open errors.
  static absl::StatusOr<std::unique_ptr<BlockStore>> Create(const BlockStoreOptions& options);
  ~BlockStore();
  BlockStore(const BlockStore&) = delete;
  BlockStore& operator=(const BlockStore&) = delete;

  // Reserves `size` bytes for block `hash`, evicting least recently used unpinned blocks as
  // needed. AlreadyExists if the block is stored (the caller skips it); Aborted if another
  // writer is writing it and `pending` is kSkip; InvalidArgument for a size outside
  // [1, max_block_bytes]; ResourceExhausted if pinned and pending blocks leave too little room.
  absl::StatusOr<PendingPut> BeginPut(uint64_t hash, int64_t size, uint32_t checksum,
                                      WhilePending pending = WhilePending::kWriteToo);

  // The committed block, pinned and made most recently used; NotFound if absent. The checksum
  // of `kind` is filled in: computed once, on first demand, if the block was written with the
  // other kind, after checking the bytes against that one (DataLoss, and the block is dropped,
  // if they changed).
  absl::StatusOr<BlockRef> Get(uint64_t hash, ChecksumKind kind = ChecksumKind::kXxh32);
  // Reads the blocks that are on disk and not in memory back into memory, all at once, so the
  // Gets that follow hit memory. Returns, per hash, whether this call read it back (the tier a
  // reader reports). Without a disk tier, nothing is read and every entry is false.
  std::vector<bool> Promote(std::span<const uint64_t> hashes);
  // Promote on the store's promote threads, then `done` with its answer there, so a caller on
  // an RPC thread does not wait for the disk. When there is nothing to read back (no disk tier,
  // or none of the blocks is on disk only), `done` runs at once on the caller's thread.
  // Queued promotions run before the store goes.
  void PromoteThen(std::vector<uint64_t> hashes, std::function<void(std::vector<bool>)> done);
  // In memory or on disk.
  bool Exists(uint64_t hash) const;
  BlockStoreStats Stats() const;

  // The shared arena blocks live in; nullptr when they are in private memory.
  const ShmArena* arena() const { return memory_->arena(); }

 private:
  friend class BlockRef;
  friend class PendingPut;

  // A block stored, being written, or both (a writer began before an eviction or a commit).
  // Each PendingPut owns its own space until it commits.
  struct Entry {
    uint8_t* data = nullptr;  // the committed bytes; nullptr until then
    int64_t size = 0;         // of `data`, counted in used_bytes_
    std::optional<uint32_t> checksum32;
    std::optional<uint64_t> checksum64;
    bool committed = false;
    bool on_disk = false;   // the disk tier holds it (spilled, or promoted from there)
    bool promoted = false;  // read back from disk and not yet got: its first Get is a disk hit
    int writers = 0;  // PendingPuts not yet committed or abandoned
    int pins = 0;
    std::list<uint64_t>::iterator lru;  // valid while committed and unpinned
  };

  BlockStore(const BlockStoreOptions& options, std::unique_ptr<BlockMemory> memory,
             std::unique_ptr<DiskTier> disk);
  // A pinned block and which of its checksums are known.
  struct Pinned {
    BlockRef ref;
    bool has32 = false;
    bool has64 = false;
  };
  // The committed block in memory, pinned; NotFound (not counted) if absent.
  absl::StatusOr<Pinned> Pin(uint64_t hash) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fills in the checksum of `kind` if the block was committed with the other, after checking
  // the bytes against that one: DataLoss, and the block is dropped, if they changed.
  absl::Status Vouch(Pinned& p, ChecksumKind kind);
  // BeginPut without the disk tier's check.
  absl::StatusOr<PendingPut> Reserve(uint64_t hash, int64_t size, uint32_t checksum,
                                     WhilePending pending);
  bool InMemory(uint64_t hash) const;
  std::list<uint64_t>& LruOf(const Entry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return e.on_disk ? lru_on_disk_ : lru_;
  }
  bool SpillWorkOrStop() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stop_ || !spill_queue_.empty();
  }
  // The spill thread: writes committed blocks to the disk tier in batches until stopped.
  void SpillLoop();
  // Waits for queued blocks and pins up to a batch of those not yet on disk (perhaps none);
  // nullopt once stopped.
  std::optional<std::vector<Pinned>> NextSpillBatch();
  // `size` bytes of block memory, evicting unpinned committed blocks, oldest first, until they
  // fit in the capacity and in one free range; nullptr if pinned and pending blocks prevent it.
  uint8_t* AllocateEvicting(int64_t size) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EvictOldest() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frees a committed, unpinned block's bytes; the entry stays while writers remain.
  void Remove(absl::node_hash_map<uint64_t, Entry>::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Unpin(uint64_t hash);
  void Publish(uint64_t hash, std::span<uint8_t> data, std::optional<uint32_t> checksum32,
               std::optional<uint64_t> checksum64, bool on_disk = false);
  void Drop(uint64_t hash, std::span<uint8_t> data);  // an abandoned or failed pending put
  void Discard(uint64_t hash);  // a committed block found corrupt, unless pinned by others

  const BlockStoreOptions options_;
  const std::unique_ptr<BlockMemory> memory_;  // mutated only under mu_
  mutable absl::Mutex mu_;
  // node_hash_map: entries are found by hash while others are inserted and erased.
  absl::node_hash_map<uint64_t, Entry> entries_ ABSL_GUARDED_BY(mu_);
  // Unpinned committed blocks, oldest first: those only in memory, and those also on disk (which
  // is where an entry is changes only while it is pinned).
  std::list<uint64_t> lru_ ABSL_GUARDED_BY(mu_);
  std::list<uint64_t> lru_on_disk_ ABSL_GUARDED_BY(mu_);
  int64_t used_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t committed_blocks_ ABSL_GUARDED_BY(mu_) = 0;
  BlockStoreStats counters_ ABSL_GUARDED_BY(mu_);

  const std::unique_ptr<DiskTier> disk_;                   // nullptr: none
  std::deque<uint64_t> spill_queue_ ABSL_GUARDED_BY(mu_);  // committed, oldest first
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread spiller_;  // started once the rest exists
  // PromoteThen's threads (with a disk tier); emptied first when the store goes.
  std::unique_ptr<WorkQueue> promoter_;
};

}  // namespace tandem::cache_store
