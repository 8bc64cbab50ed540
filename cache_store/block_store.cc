#include "cache_store/block_store.h"

#include <xxhash.h>

#include <cassert>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tandem::cache_store {

uint32_t BlockChecksum(std::span<const uint8_t> bytes) {
  return XXH32(bytes.data(), bytes.size(), 0);
}

BlockRef& BlockRef::operator=(BlockRef&& other) noexcept {
  if (this != &other) {
    Reset();
    store_ = std::exchange(other.store_, nullptr);
    hash_ = other.hash_;
    checksum_ = other.checksum_;
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
    buffer_ = std::move(other.buffer_);
  }
  return *this;
}

absl::Status PendingPut::Append(std::span<const uint8_t> bytes) {
  if (store_ == nullptr) return absl::FailedPreconditionError("put already finished");
  if (static_cast<int64_t>(bytes.size()) > size() - written_) {
    return absl::OutOfRangeError(absl::StrCat("block ", hash_, ": ", written_ + bytes.size(),
                                              " bytes sent, ", size(), " declared"));
  }
  if (!bytes.empty()) std::memcpy(buffer_.data() + written_, bytes.data(), bytes.size());
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
  if (BlockChecksum(buffer_) != checksum_) {
    Abandon();
    return absl::DataLossError(absl::StrCat("block ", hash_, ": checksum mismatch"));
  }
  return std::exchange(store_, nullptr)->Publish(hash_, std::move(buffer_));
}

void PendingPut::Abandon() {
  if (store_ != nullptr) std::exchange(store_, nullptr)->Drop(hash_);
  buffer_ = {};
}

absl::StatusOr<std::unique_ptr<BlockStore>> BlockStore::Create(const BlockStoreOptions& options) {
  if (options.capacity_bytes <= 0 || options.max_block_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("block store: capacity_bytes (", options.capacity_bytes,
                     ") and max_block_bytes (", options.max_block_bytes, ") must be positive"));
  }
  return std::unique_ptr<BlockStore>(new BlockStore(options));
}

BlockStore::~BlockStore() {
#ifndef NDEBUG
  absl::MutexLock lock(&mu_);
  for (const auto& entry : entries_) {
    assert(entry.second.pins == 0 && entry.second.committed &&
           "BlockRef or PendingPut outlived its store");
  }
#endif
}

bool BlockStore::MakeRoom(int64_t size) {
  while (used_bytes_ + size > options_.capacity_bytes) {
    if (lru_.empty()) return false;
    const uint64_t victim = lru_.front();
    lru_.pop_front();
    auto it = entries_.find(victim);
    used_bytes_ -= it->second.reserved;
    entries_.erase(it);
    ++counters_.evictions;
  }
  return true;
}

absl::StatusOr<PendingPut> BlockStore::BeginPut(uint64_t hash, int64_t size, uint32_t checksum) {
  if (size <= 0 || size > options_.max_block_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("block ", hash, ": size ", size, " outside [1, ",
                                                   options_.max_block_bytes, "]"));
  }
  absl::MutexLock lock(&mu_);
  if (entries_.contains(hash)) {
    ++counters_.put_skipped;
    return absl::AlreadyExistsError(absl::StrCat("block ", hash, " is stored or being written"));
  }
  if (size > options_.capacity_bytes || !MakeRoom(size)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("block ", hash, ": ", size, " bytes do not fit; ", used_bytes_, " of ",
                     options_.capacity_bytes, " bytes are pinned or being written"));
  }
  Entry& entry = entries_[hash];
  entry.reserved = size;
  entry.checksum = checksum;
  used_bytes_ += size;
  ++counters_.pending_puts;
  return PendingPut(this, hash, size, checksum);
}

absl::Status BlockStore::Publish(uint64_t hash, std::vector<uint8_t> data) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(hash);
  assert(it != entries_.end() && !it->second.committed);
  Entry& entry = it->second;
  entry.data = std::move(data);
  entry.committed = true;
  entry.lru = lru_.insert(lru_.end(), hash);
  --counters_.pending_puts;
  ++counters_.puts;
  return absl::OkStatus();
}

void BlockStore::Drop(uint64_t hash) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(hash);
  assert(it != entries_.end() && !it->second.committed);
  used_bytes_ -= it->second.reserved;
  entries_.erase(it);
  --counters_.pending_puts;
  ++counters_.put_aborted;
}

absl::StatusOr<BlockRef> BlockStore::Get(uint64_t hash) {
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
  BlockRef ref;
  ref.store_ = this;
  ref.hash_ = hash;
  ref.checksum_ = entry.checksum;
  ref.data_ = entry.data;
  return ref;
}

void BlockStore::Unpin(uint64_t hash) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(hash);
  assert(it != entries_.end() && it->second.pins > 0);
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
  s.blocks = static_cast<int64_t>(entries_.size()) - counters_.pending_puts;
  return s;
}

}  // namespace tandem::cache_store
