#include "common/kv/kv_cache_manager.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/kv/kv_rows.h"
#include "common/util/check.h"

namespace tandem::kv {

namespace {

// Blocks [first, end) of a sequence that has `num_computed` tokens written are behind the window
// and past the sinks: a mixed cache keeps them in int8.
std::pair<int64_t, int64_t> NarrowRange(const MixedKvOptions& m, int64_t block_size,
                                        int64_t num_computed) {
  const int64_t first = (m.sink_tokens + block_size - 1) / block_size;
  const int64_t end = std::max<int64_t>(num_computed - m.window_tokens, 0) / block_size;
  return {first, std::max(first, end)};
}

}  // namespace

MixedKvFootprint MixedFootprint(const KvLayout& wide, const MixedKvOptions& mixed,
                                int64_t context) {
  KvLayout narrow = wide;
  narrow.dtype = DType::kI8;
  const auto [first, end] = NarrowRange(mixed, wide.block_size, context);
  MixedKvFootprint f;
  f.narrow_tokens = (end - first) * wide.block_size;
  f.wide_tokens = context - f.narrow_tokens;
  f.bytes = f.wide_tokens * wide.BytesPerToken() + f.narrow_tokens * narrow.BytesPerToken();
  return f;
}

absl::StatusOr<std::unique_ptr<KvCacheManager>> KvCacheManager::Create(
    const KvCacheOptions& options) {
  if (options.mixed.narrow_blocks > 0 &&
      (options.mixed.sink_tokens < 0 || options.mixed.window_tokens < 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cache: mixed sink_tokens = ", options.mixed.sink_tokens,
                     " and window_tokens = ", options.mixed.window_tokens, " must be >= 0"));
  }
  auto pool = BlockPool::Create(options.layout, options.num_blocks, options.mixed.narrow_blocks,
                                options.memory);
  if (!pool.ok()) return pool.status();
  return std::unique_ptr<KvCacheManager>(new KvCacheManager(options, std::move(pool).value()));
}

KvCacheManager::KvCacheManager(const KvCacheOptions& options, std::unique_ptr<BlockPool> pool)
    : layout_(options.layout),
      model_id_(options.model_id),
      model_hash_(
          HashModelId(options.model_id, options.weight_quantization, options.weights_fingerprint)),
      prefix_caching_(options.enable_prefix_caching),
      mixed_(options.mixed),
      arena_(pool->arena()),
      pool_(std::move(pool)) {
  index_.reserve(pool_->num_blocks());
}

const uint8_t* KvCacheManager::ReadableBlock(int32_t id, std::vector<uint8_t>& scratch) const {
  BlockMemory& memory = pool_->memory();
  if (memory.host_addressable()) return arena_.Block(id);
  const size_t bytes = arena_.LayoutOf(id).BlockBytes();
  scratch.resize(bytes);
  memory.ToHost(scratch.data(), arena_.Block(id), bytes);
  return scratch.data();
}

void KvCacheManager::WriteBlock(int32_t id, const uint8_t* src, const KvLayout& from) {
  BlockMemory& memory = pool_->memory();
  const KvLayout& to = arena_.LayoutOf(id);
  if (memory.host_addressable()) {
    ConvertBlock(src, from, arena_.Block(id), to);
    return;
  }
  if (!(from == to)) {
    write_scratch_.resize(to.BlockBytes());
    ConvertBlock(src, from, write_scratch_.data(), to);
    src = write_scratch_.data();
  }
  memory.FromHost(arena_.Block(id), src, to.BlockBytes());
}

int32_t KvCacheManager::AllocateBlock(BlockKind kind, bool only_kind) {
  bool evicted = false;
  BlockHash evicted_hash = 0;
  const int32_t id = pool_->Allocate(&evicted, &evicted_hash, kind, only_kind);
  TANDEM_CHECK(id != kNoBlock || only_kind, "the block pool ran out (callers reserve first)");
  if (evicted) {
    const size_t erased = index_.erase(evicted_hash);
    TANDEM_CHECK(erased == 1, "an evicted block missing from the prefix index");
    events_.Removed(evicted_hash);
    ++evictions_;
  }
  return id;
}

absl::StatusOr<int> KvCacheManager::AddSequence(int64_t seq_id, std::span<const int32_t> prompt,
                                                BlockHash salt, bool reuse) {
  const int bs = layout_.block_size;
  if (seqs_.contains(seq_id)) {
    return absl::AlreadyExistsError(absl::StrCat("KV cache: sequence ", seq_id, " exists"));
  }
  Sequence seq;
  seq.salt = salt;
  seq.blocks.reserve(prompt.size() / bs + 2);  // the prompt plus the first generated tokens
  seq.hashes.reserve(prompt.size() / bs + 1);
  if (prefix_caching_ && reuse && !prompt.empty()) {
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
  return num_new_blocks <= pool_->num_available();
}

int64_t KvCacheManager::NumAvailableBlocks() const { return pool_->num_available(); }

void KvCacheManager::CommitTokens(int64_t seq_id, std::span<const int32_t> tokens,
                                  int num_computed) {
  if (!prefix_caching_ && !mixed()) return;
  const int64_t bs = layout_.block_size;
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return;
  Sequence& seq = it->second;
  if (mixed()) NarrowOldBlocks(seq, num_computed);
  if (!prefix_caching_ || seq.evicted) return;
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
    if (id == kNoBlock || pool_->block(id).indexed) continue;
    // An identical block already indexed wins; this one stays unindexed (freed on release).
    if (index_.try_emplace(h, id).second) {
      pool_->SetIndexed(id, h);
      events_.Stored(h);
    }
  }
}

void KvCacheManager::NarrowOldBlocks(Sequence& seq, int num_computed) {
  const auto [first, end] = NarrowRange(mixed_, layout_.block_size, num_computed);
  const size_t stop = std::min(seq.blocks.size(), static_cast<size_t>(end));
  // A block shared with another sequence stays fp16 for now and holds next_narrow back, so it is
  // converted at a later commit once the other sequences have let go of it.
  bool settled = true;  // every block from next_narrow to b is int8 or evicted
  for (size_t b = std::max(seq.next_narrow, static_cast<size_t>(first)); b < stop; ++b) {
    if (settled) seq.next_narrow = b;
    const int32_t wide = seq.blocks[b];
    if (wide == kNoBlock || arena_.IsNarrow(wide)) continue;
    if (pool_->block(wide).ref_count > 1) {
      settled = false;
      continue;
    }
    const int32_t narrow = AllocateBlock(BlockKind::kNarrow, /*only_kind=*/true);
    if (narrow == kNoBlock) return;  // tried again at the next commit
    WriteBlock(narrow, ReadableBlock(wide, read_scratch_), layout_);
    if (const KvBlock& old = pool_->block(wide); old.indexed) {
      const BlockHash hash = old.hash;
      pool_->ClearIndexed(wide);
      pool_->SetIndexed(narrow, hash);
      index_[hash] = narrow;
    }
    pool_->Release(wide);
    seq.blocks[b] = narrow;
    ++narrowed_;
  }
  if (settled) seq.next_narrow = std::max(seq.next_narrow, stop);
}

void KvCacheManager::FreeSequence(int64_t seq_id) {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return;
  const std::vector<int32_t>& blocks = it->second.blocks;
  for (auto b = blocks.rbegin(); b != blocks.rend(); ++b) {
    if (*b != kNoBlock) pool_->Release(*b);
  }
  seqs_.erase(it);
}

int KvCacheManager::EvictBlocks(int64_t seq_id, int first, int last) {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return 0;
  std::vector<int32_t>& blocks = it->second.blocks;
  int evicted = 0;
  const int end = std::min(last, static_cast<int>(blocks.size()));
  for (int b = std::max(first, 0); b < end; ++b) {
    if (blocks[b] == kNoBlock) continue;
    pool_->Release(blocks[b]);
    blocks[b] = kNoBlock;
    ++evicted;
  }
  it->second.evicted |= evicted > 0;
  window_evicted_ += evicted;
  return evicted;
}

void KvCacheManager::CancelSequence(int64_t seq_id) {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return;
  hits_ -= it->second.lookup_hits;
  misses_ -= it->second.lookup_misses;
  FreeSequence(seq_id);
}

std::vector<int32_t> KvCacheManager::FindCachedPrefix(std::span<const BlockHash> hashes) const {
  std::vector<int32_t> ids;
  for (BlockHash h : hashes) {
    auto it = index_.find(h);
    if (it == index_.end()) break;
    ids.push_back(it->second);
  }
  return ids;
}

std::vector<int32_t> KvCacheManager::BlockTable(int64_t seq_id) const {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return {};
  return it->second.blocks;
}

const int32_t* KvCacheManager::BlockTableData(int64_t seq_id) const {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return nullptr;
  return it->second.blocks.data();
}

int KvCacheManager::NumBlocks(int64_t seq_id) const {
  auto it = seqs_.find(seq_id);
  return it == seqs_.end() ? 0 : static_cast<int>(it->second.blocks.size());
}

KvCacheStats KvCacheManager::Stats() const {
  KvCacheStats s;
  s.total_blocks = pool_->num_blocks();
  s.free_blocks = pool_->num_free();
  s.used_blocks = pool_->num_used();
  s.cached_blocks = pool_->num_cached();
  s.hits = hits_;
  s.misses = misses_;
  s.evictions = evictions_;
  s.narrow_blocks = pool_->num_narrow();
  s.narrowed = narrowed_;
  s.window_evicted = window_evicted_;
  s.num_sequences = static_cast<int64_t>(seqs_.size());
  return s;
}

void KvCacheManager::ResetPrefixCache() {
  for (int32_t id = pool_->LruHead(); id != kNoBlock; id = pool_->LruHead()) {
    const BlockHash hash = pool_->DropCached(id);
    index_.erase(hash);
    events_.Removed(hash);
  }
}

int32_t KvCacheManager::BlockRefCount(int32_t block_id) const {
  return pool_->IsValidId(block_id) ? pool_->block(block_id).ref_count : -1;
}

std::vector<BlockHash> KvCacheManager::IndexedHashes() const {
  std::vector<BlockHash> hashes;
  hashes.reserve(index_.size());
  for (const auto& [hash, block] : index_) hashes.push_back(hash);
  return hashes;
}

bool KvCacheManager::ContainsHash(BlockHash hash) const { return index_.contains(hash); }

absl::Status KvCacheManager::CheckBlocksLive(std::span<const int32_t> block_ids) const {
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
    std::span<const BlockHash> hashes, std::span<const uint8_t* const> block_data,
    const std::optional<KvLayout>& data_layout) {
  const KvLayout& from = data_layout.value_or(layout_);
  const BlockKind kind =
      mixed() && from.dtype == DType::kI8 ? BlockKind::kNarrow : BlockKind::kWide;
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
    const int32_t id = AllocateBlock(kind);
    WriteBlock(id, block_data[i], from);
    index_.emplace(hashes[i], id);
    pool_->SetIndexed(id, hashes[i]);
    events_.Stored(hashes[i]);
    fresh.push_back(id);
  }
  // Last block released first: within a chain the tail is evicted before the head.
  for (auto b = fresh.rbegin(); b != fresh.rend(); ++b) pool_->Release(*b);
  for (int32_t id : pinned) pool_->Release(id);
  result.imported = static_cast<int64_t>(fresh.size());
  return result;
}

}  // namespace tandem::kv
