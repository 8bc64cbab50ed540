#include "cache_store/block_store.h"

#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/util/check.h"
#include "common/util/log.h"

namespace tandem::cache_store {

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
      ->Publish(hash_, std::exchange(data_, {}), std::nullopt, checksum64);
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
        NewSharedBlockMemory(options.capacity_bytes);
    if (shared.ok()) {
      memory = *std::move(shared);
    } else {
      Log(LogLevel::kWarning, "cache-store",
          absl::StrCat("no shared-memory fast path, blocks stay private: ",
                       shared.status().ToString()));
    }
  }
  if (memory == nullptr) memory = NewHeapBlockMemory();
  return std::unique_ptr<BlockStore>(new BlockStore(options, std::move(memory)));
}

BlockStore::~BlockStore() {
  absl::MutexLock lock(&mu_);
  for (auto& [hash, entry] : entries_) {
    TANDEM_CHECK(entry.pins == 0 && entry.writers == 0,
                 "a BlockRef or PendingPut outlived its store");
    memory_->Free(entry.data, entry.size);
  }
}

void BlockStore::Remove(absl::node_hash_map<uint64_t, Entry>::iterator it) {
  Entry& entry = it->second;
  lru_.erase(entry.lru);
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
  Remove(entries_.find(lru_.front()));
  ++counters_.evictions;
}

uint8_t* BlockStore::AllocateEvicting(int64_t size) {
  while (used_bytes_ + size > options_.capacity_bytes) {
    if (lru_.empty()) return nullptr;
    EvictOldest();
  }
  while (true) {  // an arena may also need a free range large enough
    if (uint8_t* data = memory_->Allocate(size)) return data;
    if (lru_.empty()) return nullptr;
    EvictOldest();
  }
}

absl::StatusOr<PendingPut> BlockStore::BeginPut(uint64_t hash, int64_t size, uint32_t checksum,
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
                         std::optional<uint64_t> checksum64) {
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
  entry.lru = lru_.insert(lru_.end(), hash);
  ++committed_blocks_;
  ++counters_.puts;
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

absl::StatusOr<BlockRef> BlockStore::Get(uint64_t hash, ChecksumKind kind) {
  BlockRef ref;
  bool compute = false;
  {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(hash);
    if (it == entries_.end() || !it->second.committed) {
      ++counters_.misses;
      return absl::NotFoundError(absl::StrCat("block ", hash, " is not stored"));
    }
    Entry& entry = it->second;
    if (entry.pins++ == 0) {
      lru_.erase(entry.lru);
      ++counters_.pinned_blocks;
    }
    ++counters_.hits;
    ref.store_ = this;
    ref.hash_ = hash;
    ref.data_ = {entry.data, static_cast<size_t>(entry.size)};
    ref.checksum_ = entry.checksum32.value_or(0);
    ref.checksum64_ = entry.checksum64.value_or(0);
    compute = kind == ChecksumKind::kXxh32 ? !entry.checksum32 : !entry.checksum64;
  }
  if (compute) {
    // Outside the lock: the block is pinned. The bytes are checked against the checksum they
    // were committed with before a new one vouches for them (shared memory is writable by
    // every attached client).
    bool intact;
    if (kind == ChecksumKind::kXxh32) {
      intact = store::BlockChecksum64(ref.data_) == ref.checksum64_;
      ref.checksum_ = store::BlockChecksum(ref.data_);
    } else {
      intact = store::BlockChecksum(ref.data_) == ref.checksum_;
      ref.checksum64_ = store::BlockChecksum64(ref.data_);
    }
    if (!intact) {
      ref.Reset();
      Discard(hash);
      return absl::DataLossError(absl::StrCat("block ", hash, " changed after it was written"));
    }
    absl::MutexLock lock(&mu_);
    Entry& entry = entries_.find(hash)->second;  // pinned, so still there
    if (kind == ChecksumKind::kXxh32) {
      entry.checksum32 = ref.checksum_;
    } else {
      entry.checksum64 = ref.checksum64_;
    }
  }
  return ref;
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
    entry.lru = lru_.insert(lru_.end(), hash);  // released: most recently used
    --counters_.pinned_blocks;
  }
}

bool BlockStore::Exists(uint64_t hash) const {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(hash);
  return it != entries_.end() && it->second.committed;
}

BlockStoreStats BlockStore::Stats() const {
  absl::MutexLock lock(&mu_);
  BlockStoreStats s = counters_;
  s.capacity_bytes = options_.capacity_bytes;
  s.used_bytes = used_bytes_;
  s.blocks = committed_blocks_;
  return s;
}

}  // namespace tandem::cache_store
