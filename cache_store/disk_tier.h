// The second tier of a cache-store shard: KV blocks on local disk, behind the shard's DRAM.
//
// Blocks live in preallocated segment files at page-aligned addresses; `index.log` (disk_log.h)
// records each put and drop, so a shard restarted on the same directory rebuilds its index and
// serves what survived. The tier evicts its own least recently used blocks to make room. Every
// read is checked against the XXH3-64 its record carries: a block whose bytes changed or never
// reached the disk is a miss (counted, its record dropped), never wrong data.
//
// Writes are group commits: a batch's block bytes, one sync of each segment touched, then the
// batch's records (and the drops since the last batch) in one append and one sync of the log.
// A crash at any step leaves a log whose valid prefix names only blocks whose bytes were written
// (or, if not synced before a power loss, fail their checksum on read).
//
// Thread-safe. Write is meant for one spilling thread at a time (the BlockStore's); Read fans a
// batch of reads out over the tier's own I/O threads and returns when all are done. Block I/O
// runs outside every lock; `log_mu_` serialises the log's appends (file I/O under it is the
// point), and when both are held it is taken before `mu_`.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "cache_store/arena_allocator.h"
#include "cache_store/disk_io.h"
#include "cache_store/disk_log.h"
#include "common/util/work_queue.h"

namespace tandem::cache_store {

struct DiskTierOptions {
  std::string directory;
  int64_t capacity_bytes = 0;  // rounded down to whole segments; at least one segment
  int64_t segment_bytes = int64_t{256} << 20;
  int io_threads = 2;  // concurrent reads of one batch
  // The log is rewritten with only the live blocks once it holds this many records and four
  // times as many as there are blocks.
  int64_t compact_log_records = 4096;
  DiskFs* fs = nullptr;  // nullptr: PosixDiskFs()
  // Called after each block read or written (outside every lock), for latency histograms;
  // on_read from the I/O threads, several at once.
  std::function<void(double seconds, int64_t bytes)> on_read, on_write;
};

// Counters since the tier opened, and its occupancy.
struct DiskTierStats {
  int64_t capacity_bytes = 0;
  int64_t used_bytes = 0;      // blocks stored plus space being written
  int64_t blocks = 0;          // blocks readable
  int64_t hits = 0;            // blocks read back intact
  int64_t misses = 0;          // blocks asked for and not stored (or evicted during the read)
  int64_t writes = 0;          // blocks written and logged
  int64_t write_failures = 0;  // blocks not written: an I/O error or a full disk
  int64_t write_no_room = 0;   // blocks not written: larger than a segment
  int64_t evictions = 0;
  int64_t corrupt = 0;  // blocks whose bytes failed their checksum on read; record dropped
  int64_t stale = 0;    // blocks of another layout id than the reader's; record dropped
  int64_t read_bytes = 0;
  int64_t write_bytes = 0;
  int64_t recovered_blocks = 0;     // found in the log at open
  int64_t discarded_log_bytes = 0;  // a torn or corrupt log tail dropped at open
};

struct DiskBlockWrite {
  uint64_t hash = 0;
  uint64_t layout_id = 0;
  std::span<const uint8_t> data;
  uint64_t checksum64 = 0;  // XXH3-64 of `data` (store::BlockChecksum64)
};

struct DiskBlockRead {
  uint64_t hash = 0;
  uint64_t layout_id = 0;   // 0: any; else a block recorded with another id is dropped
  std::span<uint8_t> out;   // exactly the block's size (SizeOf)
  uint64_t checksum64 = 0;  // set on success
  absl::Status status;      // OK, NotFound, DataLoss (corrupt) or FailedPrecondition (stale)
};

class DiskTier {
 public:
  // Opens (creating) the directory and recovers the blocks its log names. A log of another
  // format version or segment geometry is discarded and the tier starts empty; errors only for
  // a directory or files that cannot be created or read.
  static absl::StatusOr<std::unique_ptr<DiskTier>> Open(const DiskTierOptions& options);
  ~DiskTier();
  DiskTier(const DiskTier&) = delete;
  DiskTier& operator=(const DiskTier&) = delete;

  // Writes blocks as one group commit, evicting the tier's least recently used blocks for room.
  // One status per block: OK (stored), AlreadyExists, ResourceExhausted (larger than a segment,
  // or the disk is full), or the I/O error that stopped it.
  std::vector<absl::Status> Write(std::span<const DiskBlockWrite> blocks);

  // Reads the blocks, all at once over the I/O threads; each read sets its status. A block read
  // intact becomes the most recently used.
  void Read(std::span<DiskBlockRead> reads);

  bool Contains(uint64_t hash) const;
  // The stored block's size, if stored.
  std::optional<int64_t> SizeOf(uint64_t hash) const;
  // Forgets a block (its drop is logged with the next write).
  void Erase(uint64_t hash);
  DiskTierStats Stats() const;
  const DiskGeometry& geometry() const { return geometry_; }

 private:
  struct Entry {
    int64_t address = 0;
    int64_t length = 0;
    uint64_t layout_id = 0;
    uint64_t checksum64 = 0;
    uint64_t generation = 0;            // tells a read whether the entry it read is still this one
    bool ready = false;                 // logged; false while being written
    std::list<uint64_t>::iterator lru;  // valid while ready
  };
  using Entries = absl::flat_hash_map<uint64_t, Entry>;

  DiskTier(const DiskTierOptions& options, const DiskGeometry& geometry)
      : options_(options), geometry_(geometry), io_(std::max(1, options.io_threads)) {}
  absl::Status Recover();
  Entry NewEntry(int64_t address, int64_t length, uint64_t layout_id, uint64_t checksum64)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status StartEmptyLog() ABSL_EXCLUSIVE_LOCKS_REQUIRED(log_mu_);
  // Space for `length` bytes, evicting least recently used blocks; nullopt if none can fit.
  std::optional<int64_t> AllocateEvicting(int64_t length) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes an entry, frees its space and queues its drop record.
  void Remove(Entries::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Appends records to the log and syncs it; the log end moves only on success.
  absl::Status AppendToLog(std::span<const DiskLogRecord> records)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(log_mu_);
  // Rewrites the log with only the live blocks once dead records dominate it.
  void MaybeCompactLog() ABSL_EXCLUSIVE_LOCKS_REQUIRED(log_mu_);
  // Writes `live` as a new log beside the current one and renames it over it.
  absl::Status RewriteLog(std::span<const DiskLogRecord> live)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(log_mu_);
  void ReadOne(DiskBlockRead& read);
  DiskFile& SegmentOf(int64_t address) const {
    return *segments_[static_cast<size_t>(address / geometry_.segment_bytes)];
  }
  std::string LogPath() const;

  const DiskTierOptions options_;
  const DiskGeometry geometry_;
  DiskFs* fs_ = nullptr;
  std::vector<std::unique_ptr<DiskFile>> segments_;  // fixed after Open

  absl::Mutex log_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  std::unique_ptr<DiskFile> log_ ABSL_GUARDED_BY(log_mu_);
  int64_t log_end_ ABSL_GUARDED_BY(log_mu_) = 0;
  int64_t log_records_ ABSL_GUARDED_BY(log_mu_) = 0;

  mutable absl::Mutex mu_;
  Entries entries_ ABSL_GUARDED_BY(mu_);
  std::list<uint64_t> lru_ ABSL_GUARDED_BY(mu_);  // ready blocks, least recently used first
  std::vector<ArenaAllocator> space_ ABSL_GUARDED_BY(mu_);  // one per segment
  size_t next_segment_ ABSL_GUARDED_BY(mu_) = 0;            // where allocation tries first
  std::vector<DiskLogRecord> drops_ ABSL_GUARDED_BY(mu_);   // to log with the next write
  uint64_t next_generation_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t used_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  DiskTierStats counters_ ABSL_GUARDED_BY(mu_);

  WorkQueue io_;  // last: its threads finish before the rest is destroyed
};

}  // namespace tandem::cache_store
