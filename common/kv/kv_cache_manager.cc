#include "common/kv/kv_cache_manager.h"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace tandem::kv {

absl::StatusOr<std::unique_ptr<KvCacheManager>> KvCacheManager::Create(
    const KvCacheOptions& options) {
  auto pool = BlockPool::Create(options.layout, options.num_blocks);
  if (!pool.ok()) return pool.status();
  return std::unique_ptr<KvCacheManager>(new KvCacheManager(options, std::move(pool).value()));
}

KvCacheManager::KvCacheManager(const KvCacheOptions& options, std::unique_ptr<BlockPool> pool)
    : layout_(options.layout),
      model_id_(options.model_id),
      model_hash_(HashModelId(options.model_id)),
      prefix_caching_(options.enable_prefix_caching),
      base_(pool->base()),
      pool_(std::move(pool)) {
  index_.reserve(pool_->num_blocks());
}

int32_t KvCacheManager::AllocateBlock() {
  bool evicted = false;
  BlockHash evicted_hash = 0;
  const int32_t id = pool_->Allocate(&evicted, &evicted_hash);
  assert(id != kNoBlock);
  if (evicted) {
    [[maybe_unused]] const size_t erased = index_.erase(evicted_hash);
    assert(erased == 1);
    ++evictions_;
  }
  return id;
}

absl::StatusOr<int> KvCacheManager::AddSequence(int64_t seq_id, std::span<const int32_t> prompt,
                                                BlockHash salt) {
  const int bs = layout_.block_size;
  absl::MutexLock lock(&mu_);
  if (seqs_.contains(seq_id)) {
    return absl::AlreadyExistsError(absl::StrCat("KV cache: sequence ", seq_id, " exists"));
  }
  Sequence seq;
  seq.salt = salt;
  seq.blocks.reserve(prompt.size() / bs + 2);  // the prompt plus the first generated tokens
  seq.hashes.reserve(prompt.size() / bs + 1);
  if (prefix_caching_ && !prompt.empty()) {
    const size_t max_blocks = (prompt.size() - 1) / bs;
    BlockHash prev = salt;
    for (size_t i = 0; i < max_blocks; ++i) {
      const BlockHash h = HashBlock(model_hash_, prev, prompt.subspan(i * bs, bs));
      auto it = index_.find(h);
      if (it == index_.end()) {
        ++seq.lookup_misses;
        break;
      }
      ++seq.lookup_hits;
      pool_->Acquire(it->second);
      seq.blocks.push_back(it->second);
      seq.hashes.push_back(h);
      prev = h;
    }
  }
  const int cached_tokens = static_cast<int>(seq.blocks.size()) * bs;
  hits_ += seq.lookup_hits;
  misses_ += seq.lookup_misses;
  seqs_.emplace(seq_id, std::move(seq));
  return cached_tokens;
}

absl::Status KvCacheManager::Reserve(int64_t seq_id, int num_tokens) {
  if (num_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat("KV cache: num_tokens = ", num_tokens));
  }
  const int64_t bs = layout_.block_size;
  absl::MutexLock lock(&mu_);
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) {
    return absl::NotFoundError(absl::StrCat("KV cache: unknown sequence ", seq_id));
  }
  std::vector<int32_t>& blocks = it->second.blocks;
  const int64_t need = (num_tokens + bs - 1) / bs - static_cast<int64_t>(blocks.size());
  if (need <= 0) return absl::OkStatus();
  if (need > pool_->num_available()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("KV cache out of blocks: sequence ", seq_id, " needs ", need,
                     " more block(s) to hold ", num_tokens, " tokens, but only ",
                     pool_->num_available(), " are available (", pool_->num_free(), " free + ",
                     pool_->num_cached(), " evictable of ", pool_->num_blocks(), ")"));
  }
  for (int64_t i = 0; i < need; ++i) blocks.push_back(AllocateBlock());
  return absl::OkStatus();
}

bool KvCacheManager::CanAllocate(int64_t num_new_blocks) const {
  absl::MutexLock lock(&mu_);
  return num_new_blocks <= pool_->num_available();
}

int64_t KvCacheManager::NumAvailableBlocks() const {
  absl::MutexLock lock(&mu_);
  return pool_->num_available();
}

void KvCacheManager::CommitTokens(int64_t seq_id, std::span<const int32_t> tokens,
                                  int num_computed) {
  if (!prefix_caching_) return;
  const int64_t bs = layout_.block_size;
  absl::MutexLock lock(&mu_);
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return;
  Sequence& seq = it->second;
  // Only blocks whose KV is written, whose tokens are known and that the table covers.
  const int64_t limit =
      std::min({static_cast<int64_t>(std::max(num_computed, 0)),
                static_cast<int64_t>(tokens.size()), static_cast<int64_t>(seq.blocks.size()) * bs});
  const size_t full = static_cast<size_t>(limit / bs);
  BlockHash prev = seq.hashes.empty() ? seq.salt : seq.hashes.back();
  for (size_t i = seq.hashes.size(); i < full; ++i) {
    const BlockHash h = HashBlock(model_hash_, prev, tokens.subspan(i * bs, bs));
    seq.hashes.push_back(h);
    prev = h;
    const int32_t id = seq.blocks[i];
    if (pool_->block(id).indexed) continue;
    // An identical block already indexed wins; this one stays unindexed (freed on release).
    if (index_.try_emplace(h, id).second) pool_->SetIndexed(id, h);
  }
}

void KvCacheManager::FreeSequence(int64_t seq_id) {
  absl::MutexLock lock(&mu_);
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return;
  const std::vector<int32_t>& blocks = it->second.blocks;
  for (auto b = blocks.rbegin(); b != blocks.rend(); ++b) pool_->Release(*b);
  seqs_.erase(it);
}

void KvCacheManager::CancelSequence(int64_t seq_id) {
  {
    absl::MutexLock lock(&mu_);
    auto it = seqs_.find(seq_id);
    if (it == seqs_.end()) return;
    hits_ -= it->second.lookup_hits;
    misses_ -= it->second.lookup_misses;
  }
  FreeSequence(seq_id);
}

std::vector<int32_t> KvCacheManager::FindCachedPrefix(std::span<const BlockHash> hashes) const {
  absl::MutexLock lock(&mu_);
  std::vector<int32_t> ids;
  for (BlockHash h : hashes) {
    auto it = index_.find(h);
    if (it == index_.end()) break;
    ids.push_back(it->second);
  }
  return ids;
}

std::vector<int32_t> KvCacheManager::BlockTable(int64_t seq_id) const {
  absl::MutexLock lock(&mu_);
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return {};
  return it->second.blocks;
}

const int32_t* KvCacheManager::BlockTableData(int64_t seq_id) const {
  absl::MutexLock lock(&mu_);
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return nullptr;
  return it->second.blocks.data();
}

int KvCacheManager::NumBlocks(int64_t seq_id) const {
  absl::MutexLock lock(&mu_);
  auto it = seqs_.find(seq_id);
  return it == seqs_.end() ? 0 : static_cast<int>(it->second.blocks.size());
}

KvCacheStats KvCacheManager::Stats() const {
  absl::MutexLock lock(&mu_);
  KvCacheStats s;
  s.total_blocks = pool_->num_blocks();
  s.free_blocks = pool_->num_free();
  s.used_blocks = pool_->num_used();
  s.cached_blocks = pool_->num_cached();
  s.hits = hits_;
  s.misses = misses_;
  s.evictions = evictions_;
  s.num_sequences = static_cast<int64_t>(seqs_.size());
  return s;
}

void KvCacheManager::ResetPrefixCache() {
  absl::MutexLock lock(&mu_);
  for (int32_t id = pool_->LruHead(); id != kNoBlock; id = pool_->LruHead()) {
    index_.erase(pool_->DropCached(id));
  }
}

int32_t KvCacheManager::BlockRefCount(int32_t block_id) const {
  absl::MutexLock lock(&mu_);
  return pool_->IsValidId(block_id) ? pool_->block(block_id).ref_count : -1;
}

std::vector<BlockHash> KvCacheManager::IndexedHashes() const {
  absl::MutexLock lock(&mu_);
  std::vector<BlockHash> hashes;
  hashes.reserve(index_.size());
  for (const auto& [hash, block] : index_) hashes.push_back(hash);
  return hashes;
}

bool KvCacheManager::ContainsHash(BlockHash hash) const {
  absl::MutexLock lock(&mu_);
  return index_.contains(hash);
}

absl::Status KvCacheManager::CheckBlocksLive(std::span<const int32_t> block_ids) const {
  absl::MutexLock lock(&mu_);
  for (int32_t id : block_ids) {
    if (!pool_->IsValidId(id)) {
      return absl::InvalidArgumentError(
          absl::StrCat("KV cache: block id ", id, " out of range [0, ", pool_->num_blocks(), ")"));
    }
    const KvBlock& b = pool_->block(id);
    if (b.ref_count == 0 && !b.indexed) {
      return absl::FailedPreconditionError(absl::StrCat("KV cache: block ", id, " is free"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ImportResult> KvCacheManager::InsertCachedBlocks(
    std::span<const BlockHash> hashes, std::span<const uint8_t* const> block_data) {
  if (hashes.size() != block_data.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cache: ", hashes.size(), " hashes but ", block_data.size(), " blocks"));
  }
  if (!prefix_caching_) {
    return absl::FailedPreconditionError(
        "KV cache: prefix caching is disabled, imported blocks could never be found");
  }
  ImportResult result;
  std::vector<size_t> to_insert;
  std::vector<int32_t> pinned;  // indexed blocks that must not be evicted by this import
  absl::flat_hash_set<BlockHash> seen;
  to_insert.reserve(hashes.size());
  seen.reserve(hashes.size());
  absl::MutexLock lock(&mu_);
  int64_t pinned_cached = 0;
  for (size_t i = 0; i < hashes.size(); ++i) {
    if (!seen.insert(hashes[i]).second) {
      ++result.already_present;
      continue;
    }
    auto it = index_.find(hashes[i]);
    if (it == index_.end()) {
      to_insert.push_back(i);
      continue;
    }
    ++result.already_present;
    pinned.push_back(it->second);
    if (pool_->block(it->second).ref_count == 0) ++pinned_cached;
  }
  const int64_t available = pool_->num_available() - pinned_cached;
  if (static_cast<int64_t>(to_insert.size()) > available) {
    return absl::ResourceExhaustedError(absl::StrCat("KV cache out of blocks: import needs ",
                                                     to_insert.size(), " block(s), only ",
                                                     available, " available"));
  }
  for (int32_t id : pinned) pool_->Acquire(id);
  std::vector<int32_t> fresh;
  fresh.reserve(to_insert.size());
  for (size_t i : to_insert) {
    const int32_t id = AllocateBlock();
    std::memcpy(pool_->BlockData(id), block_data[i], pool_->block_bytes());
    index_.emplace(hashes[i], id);
    pool_->SetIndexed(id, hashes[i]);
    fresh.push_back(id);
  }
  // Last block released first: within a chain the tail is evicted before the head.
  for (auto b = fresh.rbegin(); b != fresh.rend(); ++b) pool_->Release(*b);
  for (int32_t id : pinned) pool_->Release(id);
  result.imported = static_cast<int64_t>(fresh.size());
  return result;
}

}  // namespace tandem::kv
