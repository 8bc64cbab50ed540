#include "cache_store/block_store.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/util/check.h"
#include "common/util/log.h"
#include "common/util/status_macros.h"

namespace tandem::cache_store {
namespace {

// Threads reading prompts back from disk at once (each prompt's blocks are read in parallel on
// the disk tier's own I/O threads).
constexpr int kPromoteThreads = 2;

}  // namespace

BlockRef& BlockRef::operator=(BlockRef&& other) noexcept {
  if (this != &other) {
    Reset();
    store_ = std::exchange(other.store_, nullptr);
    hash_ = other.hash_;
    checksum_ = other.checksum_;
    checksum64_ = other.checksum64_;
    data_ = std::exchange(other.data_, {});
  }
  return *this;
}

void BlockRef::Reset() {
  if (store_ != nullptr) std::exchange(store_, nullptr)->Unpin(hash_);
  data_ = {};
}

PendingPut& PendingPut::operator=(PendingPut&& other) noexcept {
  if (this != &other) {
    Abandon();
    store_ = std::exchange(other.store_, nullptr);
    hash_ = other.hash_;
    checksum_ = other.checksum_;
    written_ = other.written_;
    from_disk_ = other.from_disk_;
    data_ = std::exchange(other.data_, {});
  }
  return *this;
}

absl::Status PendingPut::Append(std::span<const uint8_t> bytes) {
  if (store_ == nullptr) return absl::FailedPreconditionError("put already finished");
  if (static_cast<int64_t>(bytes.size()) > size() - written_) {
    return absl::OutOfRangeError(absl::StrCat("block ", hash_, ": ", written_ + bytes.size(),
                                              " bytes sent, ", size(), " declared"));
  }
  if (!bytes.empty()) std::memcpy(data_.data() + written_, bytes.data(), bytes.size());
  written_ += static_cast<int64_t>(bytes.size());
  return absl::OkStatus();
}

absl::Status PendingPut::Commit() {
  if (store_ == nullptr) return absl::FailedPreconditionError("put already finished");
  if (written_ != size()) {
    const std::string message =
        absl::StrCat("block ", hash_, ": ", written_, " of ", size(), " bytes sent");
    Abandon();
    return absl::FailedPreconditionError(message);
  }
  if (store::BlockChecksum(data_) != checksum_) {
    Abandon();
    return absl::DataLossError(absl::StrCat("block ", hash_, ": checksum mismatch"));
  }
  std::exchange(store_, nullptr)->Publish(hash_, std::exchange(data_, {}), checksum_, std::nullopt);
  return absl::OkStatus();
}

absl::Status PendingPut::CommitInPlace(uint64_t checksum64, bool verify) {
  if (store_ == nullptr) return absl::FailedPreconditionError("put already finished");
  if (verify && store::BlockChecksum64(data_) != checksum64) {
    Abandon();
    return absl::DataLossError(absl::StrCat("block ", hash_, ": checksum mismatch"));
  }
  written_ = size();
  std::exchange(store_, nullptr)
      ->Publish(hash_, std::exchange(data_, {}), std::nullopt, checksum64, from_disk_);
  return absl::OkStatus();
}

void PendingPut::Abandon() {
  if (store_ != nullptr) std::exchange(store_, nullptr)->Drop(hash_, data_);
  data_ = {};
}

absl::StatusOr<std::unique_ptr<BlockStore>> BlockStore::Create(const BlockStoreOptions& options) {
  if (options.capacity_bytes <= 0 || options.max_block_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("block store: capacity_bytes (", options.capacity_bytes,
                     ") and max_block_bytes (", options.max_block_bytes, ") must be positive"));
  }
  std::unique_ptr<BlockMemory> memory;
  if (options.shared_memory) {
    absl::StatusOr<std::unique_ptr<BlockMemory>> shared =
        NewSharedBlockMemory(options.capacity_bytes, options.preallocate);
    if (shared.ok()) {
      memory = *std::move(shared);
    } else if (absl::IsResourceExhausted(shared.status())) {
      return shared.status();  // asked to hold the memory now, and it is not there
    } else {
      Log(LogLevel::kWarning, "cache-store",
          absl::StrCat("no shared-memory fast path, blocks stay private: ",
                       shared.status().ToString()));
    }
  }
  if (memory == nullptr) {
    if (options.preallocate) {
      Log(LogLevel::kWarning, "cache-store",
          "cache_store.preallocate applies to the shared-memory arena; private memory is "
          "allocated block by block");
    }
    memory = NewHeapBlockMemory();
  }
  std::unique_ptr<DiskTier> disk;
  if (!options.disk.directory.empty()) {
    TANDEM_ASSIGN_OR_RETURN(disk, DiskTier::Open(options.disk));
  }
  return std::unique_ptr<BlockStore>(new BlockStore(options, std::move(memory), std::move(disk)));
}

BlockStore::BlockStore(const BlockStoreOptions& options, std::unique_ptr<BlockMemory> memory,
                       std::unique_ptr<DiskTier> disk)
    : options_(options), memory_(std::move(memory)), disk_(std::move(disk)) {
  if (disk_ != nullptr) {
    spiller_ = std::thread([this] { SpillLoop(); });
    promoter_ = std::make_unique<WorkQueue>(kPromoteThreads);
  }
}

BlockStore::~BlockStore() {
  promoter_.reset();  // runs the promotions queued, whose reads use everything below
  if (spiller_.joinable()) {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    spiller_.join();
  }
  absl::MutexLock lock(&mu_);
  for (auto& [hash, entry] : entries_) {
    TANDEM_CHECK(entry.pins == 0 && entry.writers == 0,
                 "a BlockRef or PendingPut outlived its store");
    memory_->Free(entry.data, entry.size);
  }
}

void BlockStore::Remove(absl::node_hash_map<uint64_t, Entry>::iterator it) {
  Entry& entry = it->second;
  LruOf(entry).erase(entry.lru);
  used_bytes_ -= entry.size;
  memory_->Free(entry.data, entry.size);
  --committed_blocks_;
  if (entry.writers > 0) {  // a writer began before; its commit stores the block again
    const int writers = entry.writers;
    entry = Entry();
    entry.writers = writers;
  } else {
    entries_.erase(it);
  }
}

void BlockStore::EvictOldest() {
  // Blocks on disk go first: evicting one costs a disk read later, evicting one the spill
  // thread has not written yet loses it.
  auto it = entries_.find(lru_on_disk_.empty() ? lru_.front() : lru_on_disk_.front());
  if (disk_ != nullptr && !it->second.on_disk) ++counters_.evicted_unspilled;
  Remove(it);
  ++counters_.evictions;
}

uint8_t* BlockStore::AllocateEvicting(int64_t size) {
  while (used_bytes_ + size > options_.capacity_bytes) {
    if (lru_.empty() && lru_on_disk_.empty()) return nullptr;
    EvictOldest();
  }
  while (true) {  // an arena may also need a free range large enough
    if (uint8_t* data = memory_->Allocate(size)) return data;
    if (lru_.empty() && lru_on_disk_.empty()) return nullptr;
    EvictOldest();
  }
}

absl::StatusOr<PendingPut> BlockStore::BeginPut(uint64_t hash, int64_t size, uint32_t checksum,
                                                WhilePending pending) {
  if (disk_ != nullptr && disk_->Contains(hash)) {  // asked before taking mu_: no call out under it
    absl::MutexLock lock(&mu_);
    ++counters_.put_skipped;
    return absl::AlreadyExistsError(absl::StrCat("block ", hash, " is stored on disk"));
  }
  return Reserve(hash, size, checksum, pending);
}

absl::StatusOr<PendingPut> BlockStore::Reserve(uint64_t hash, int64_t size, uint32_t checksum,
                                               WhilePending pending) {
  if (size <= 0 || size > options_.max_block_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("block ", hash, ": size ", size, " outside [1, ",
                                                   options_.max_block_bytes, "]"));
  }
  absl::MutexLock lock(&mu_);
  if (auto it = entries_.find(hash); it != entries_.end()) {
    if (it->second.committed) {
      ++counters_.put_skipped;
      return absl::AlreadyExistsError(absl::StrCat("block ", hash, " is stored"));
    }
    if (pending == WhilePending::kSkip) {
      ++counters_.put_skipped;
      return absl::AbortedError(absl::StrCat("block ", hash, " is being written by another"));
    }
  }
  uint8_t* data = size > options_.capacity_bytes ? nullptr : AllocateEvicting(size);
  if (data == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("block ", hash, ": ", size, " bytes do not fit; ", used_bytes_, " of ",
                     options_.capacity_bytes, " bytes are pinned or being written"));
  }
  ++entries_[hash].writers;  // after AllocateEvicting, which may erase entries
  used_bytes_ += size;
  ++counters_.pending_puts;
  return PendingPut(this, hash, {data, static_cast<size_t>(size)}, checksum);
}

void BlockStore::Publish(uint64_t hash, std::span<uint8_t> data, std::optional<uint32_t> checksum32,
                         std::optional<uint64_t> checksum64, bool on_disk) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(hash);
  TANDEM_CHECK(it != entries_.end() && it->second.writers > 0, "publishing a block not pending");
  Entry& entry = it->second;
  --entry.writers;
  --counters_.pending_puts;
  if (entry.committed) {  // another writer was first: this copy is not needed
    used_bytes_ -= static_cast<int64_t>(data.size());
    memory_->Free(data.data(), static_cast<int64_t>(data.size()));
    ++counters_.duplicate_puts;
    return;
  }
  entry.data = data.data();
  entry.size = static_cast<int64_t>(data.size());
  entry.checksum32 = checksum32;
  entry.checksum64 = checksum64;
  entry.committed = true;
  entry.on_disk = entry.promoted = on_disk;
  entry.lru = LruOf(entry).insert(LruOf(entry).end(), hash);
  ++committed_blocks_;
  if (on_disk) {
    ++counters_.promoted;
  } else {
    ++counters_.puts;
    if (disk_ != nullptr) spill_queue_.push_back(hash);
  }
}

void BlockStore::Drop(uint64_t hash, std::span<uint8_t> data) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(hash);
  TANDEM_CHECK(it != entries_.end() && it->second.writers > 0, "dropping a block not pending");
  used_bytes_ -= static_cast<int64_t>(data.size());
  memory_->Free(data.data(), static_cast<int64_t>(data.size()));
  if (--it->second.writers == 0 && !it->second.committed) entries_.erase(it);
  --counters_.pending_puts;
  ++counters_.put_aborted;
}

absl::StatusOr<BlockStore::Pinned> BlockStore::Pin(uint64_t hash) {
  auto it = entries_.find(hash);
  if (it == entries_.end() || !it->second.committed) {
    return absl::NotFoundError(absl::StrCat("block ", hash, " is not stored"));
  }
  Entry& entry = it->second;
  if (entry.pins++ == 0) {
    LruOf(entry).erase(entry.lru);
    ++counters_.pinned_blocks;
  }
  Pinned p;
  p.ref.store_ = this;
  p.ref.hash_ = hash;
  p.ref.data_ = {entry.data, static_cast<size_t>(entry.size)};
  p.ref.checksum_ = entry.checksum32.value_or(0);
  p.ref.checksum64_ = entry.checksum64.value_or(0);
  p.has32 = entry.checksum32.has_value();
  p.has64 = entry.checksum64.has_value();
  return p;
}

absl::Status BlockStore::Vouch(Pinned& p, ChecksumKind kind) {
  if (kind == ChecksumKind::kXxh32 ? p.has32 : p.has64) return absl::OkStatus();
  // Outside the lock: the block is pinned. The bytes are checked against the checksum they
  // were committed with before a new one vouches for them (shared memory is writable by every
  // attached client).
  const uint64_t hash = p.ref.hash();
  bool intact;
  if (kind == ChecksumKind::kXxh32) {
    intact = store::BlockChecksum64(p.ref.data_) == p.ref.checksum64_;
    p.ref.checksum_ = store::BlockChecksum(p.ref.data_);
  } else {
    intact = store::BlockChecksum(p.ref.data_) == p.ref.checksum_;
    p.ref.checksum64_ = store::BlockChecksum64(p.ref.data_);
  }
  if (!intact) {
    p.ref.Reset();
    Discard(hash);
    return absl::DataLossError(absl::StrCat("block ", hash, " changed after it was written"));
  }
  absl::MutexLock lock(&mu_);
  Entry& entry = entries_.find(hash)->second;  // pinned, so still there
  if (kind == ChecksumKind::kXxh32) {
    entry.checksum32 = p.ref.checksum_;
    p.has32 = true;
  } else {
    entry.checksum64 = p.ref.checksum64_;
    p.has64 = true;
  }
  return absl::OkStatus();
}

absl::StatusOr<BlockRef> BlockStore::Get(uint64_t hash, ChecksumKind kind) {
  absl::StatusOr<Pinned> p;
  for (bool promoted = false;; promoted = true) {
    {
      absl::MutexLock lock(&mu_);
      p = Pin(hash);
      if (p.ok()) {
        ++counters_.hits;
        Entry& entry = entries_.find(hash)->second;
        if (std::exchange(entry.promoted, false)) {
          ++counters_.memory_misses;  // served from disk
        } else {
          ++counters_.memory_hits;
        }
        break;
      }
      if (disk_ == nullptr || promoted) {
        ++counters_.misses;
        ++counters_.memory_misses;
        if (disk_ != nullptr) ++counters_.disk_misses;
        return p.status();
      }
    }
    Promote(std::span<const uint64_t>(&hash, 1));
  }
  TANDEM_RETURN_IF_ERROR(Vouch(*p, kind));
  return std::move(p->ref);
}

std::vector<bool> BlockStore::Promote(std::span<const uint64_t> hashes) {
  std::vector<bool> promoted(hashes.size(), false);
  if (disk_ == nullptr) return promoted;
  std::vector<PendingPut> puts;
  std::vector<DiskBlockRead> reads;
  std::vector<size_t> index;  // of each read in `hashes`
  for (size_t i = 0; i < hashes.size(); ++i) {
    const uint64_t hash = hashes[i];
    if (InMemory(hash)) continue;
    const std::optional<int64_t> size = disk_->SizeOf(hash);
    if (!size) continue;
    // kSkip: a block another writer is putting will be in memory soon enough.
    absl::StatusOr<PendingPut> put = Reserve(hash, *size, 0, WhilePending::kSkip);
    if (!put.ok()) continue;  // in memory after all, being written, or no room
    put->from_disk_ = true;
    DiskBlockRead read;
    read.hash = hash;
    read.out = put->data();
    reads.push_back(read);
    puts.push_back(*std::move(put));
    index.push_back(i);
  }
  if (reads.empty()) return promoted;
  disk_->Read(reads);  // verified against each record's checksum
  for (size_t i = 0; i < reads.size(); ++i) {
    if (reads[i].status.ok()) {
      promoted[index[i]] = puts[i].CommitInPlace(reads[i].checksum64, /*verify=*/false).ok();
    }
  }
  return promoted;
}

void BlockStore::PromoteThen(std::vector<uint64_t> hashes,
                             std::function<void(std::vector<bool>)> done) {
  const bool reads = promoter_ != nullptr &&
                     std::any_of(hashes.begin(), hashes.end(),
                                 [&](uint64_t h) { return !InMemory(h) && disk_->Contains(h); });
  if (!reads) {
    done(std::vector<bool>(hashes.size(), false));
    return;
  }
  promoter_->Submit(
      [this, hashes = std::move(hashes), done = std::move(done)] { done(Promote(hashes)); });
}

std::optional<std::vector<BlockStore::Pinned>> BlockStore::NextSpillBatch() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(this, &BlockStore::SpillWorkOrStop));
  if (stop_) return std::nullopt;
  // A batch pins its blocks while they are written: at most an eighth of the memory (and at
  // least one block), so puts still find room.
  std::vector<Pinned> batch;
  int64_t bytes = 0;
  while (!spill_queue_.empty() && static_cast<int>(batch.size()) < options_.spill_batch_blocks &&
         (batch.empty() || bytes < options_.capacity_bytes / 8)) {
    const uint64_t hash = spill_queue_.front();
    spill_queue_.pop_front();
    auto it = entries_.find(hash);
    if (it == entries_.end() || !it->second.committed || it->second.on_disk) continue;
    bytes += it->second.size;
    batch.push_back(*Pin(hash));
  }
  return batch;
}

void BlockStore::SpillLoop() {
  while (std::optional<std::vector<Pinned>> batch = NextSpillBatch()) {
    std::vector<DiskBlockWrite> writes;
    for (Pinned& p : *batch) {
      if (!Vouch(p, ChecksumKind::kXxh3).ok()) continue;  // changed in memory: dropped, not spilled
      writes.push_back({p.ref.hash(), 0, p.ref.data(), p.ref.checksum64()});
    }
    const std::vector<absl::Status> written = disk_->Write(writes);
    absl::MutexLock lock(&mu_);
    for (size_t i = 0; i < writes.size(); ++i) {
      if (!written[i].ok() && !absl::IsAlreadyExists(written[i])) continue;
      entries_.find(writes[i].hash)->second.on_disk = true;  // pinned, so still there
      if (written[i].ok()) ++counters_.spilled;
    }
    // The batch's pins go as it leaves scope, after the lock.
  }
}

void BlockStore::Discard(uint64_t hash) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(hash);
  if (it == entries_.end() || !it->second.committed || it->second.pins > 0) return;
  Remove(it);
  ++counters_.corrupt;
}

void BlockStore::Unpin(uint64_t hash) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(hash);
  TANDEM_CHECK(it != entries_.end() && it->second.pins > 0, "unpinning a block not pinned");
  Entry& entry = it->second;
  if (--entry.pins == 0) {
    entry.lru = LruOf(entry).insert(LruOf(entry).end(), hash);  // released: most recently used
    --counters_.pinned_blocks;
  }
}

bool BlockStore::InMemory(uint64_t hash) const {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(hash);
  return it != entries_.end() && it->second.committed;
}

bool BlockStore::Exists(uint64_t hash) const {
  return InMemory(hash) || (disk_ != nullptr && disk_->Contains(hash));
}

BlockStoreStats BlockStore::Stats() const {
  BlockStoreStats s;
  {
    absl::MutexLock lock(&mu_);
    s = counters_;
    s.capacity_bytes = options_.capacity_bytes;
    s.used_bytes = used_bytes_;
    s.blocks = committed_blocks_;
  }
  s.has_disk = disk_ != nullptr;
  if (disk_ != nullptr) s.disk = disk_->Stats();  // after mu_: the tier takes its own lock
  return s;
}

}  // namespace tandem::cache_store
