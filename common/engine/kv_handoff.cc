#include "common/engine/kv_handoff.h"

#include "common/kv/kv_transfer.h"
#include "common/util/status_macros.h"

namespace tandem::engine {

std::vector<kv::BlockHash> PromptBlockHashes(Engine& engine, std::span<const int32_t> prompt,
                                             uint64_t cache_salt) {
  kv::KvCacheManager& kv = engine.kv_cache();
  return kv::HashPrefixBlocks(kv.model_hash(), prompt, kv.layout().block_size, cache_salt);
}

ExportPlan ExportPlan::Of(const Engine& engine) {
  const kv::KvCacheManager& kv = engine.kv_cache();
  ExportPlan plan;
  plan.model_hash_ = kv.model_hash();
  plan.block_size_ = kv.layout().block_size;
  if (engine.options().pruning.enabled) plan.pruning_ = engine.options().pruning.settings;
  if (!kv.mixed()) {
    plan.block_bytes_ = static_cast<int64_t>(
        kv::ExportedBytes(kv::DescriptorOf(kv), kv.layout().BlockBytes(), /*blocks=*/1));
  }
  return plan;
}

std::vector<kv::BlockHash> ExportPlan::Hashes(std::span<const int32_t> prompt,
                                              uint64_t request_salt) const {
  const uint64_t salt = kv::CombineCacheSalts(
      request_salt, pruning_.has_value() ? PruningCacheSalt(*pruning_, prompt) : 0);
  return kv::HashPrefixBlocks(model_hash_, prompt, block_size_, salt);
}

absl::StatusOr<std::vector<ExportedBlock>> ExportPromptBlocks(Engine& engine,
                                                              std::span<const int32_t> prompt,
                                                              uint64_t cache_salt) {
  kv::KvCacheManager& kv = engine.kv_cache();
  const std::vector<kv::BlockHash> hashes = PromptBlockHashes(engine, prompt, cache_salt);
  const std::vector<int32_t> ids = kv.FindCachedPrefix(hashes);
  std::vector<ExportedBlock> out;
  out.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    TANDEM_ASSIGN_OR_RETURN(std::string bytes,
                            kv::ExportBlocks(kv, std::span(&ids[i], 1), std::span(&hashes[i], 1)));
    out.push_back({.hash = hashes[i], .bytes = std::move(bytes)});
  }
  return out;
}

ImportStats ImportPromptBlocks(Engine& engine, std::span<const kv::BlockHash> hashes,
                               std::span<const std::optional<std::string>> blocks) {
  kv::KvCacheManager& kv = engine.kv_cache();
  ImportStats stats;
  const size_t n = std::min(hashes.size(), blocks.size());
  size_t i = 0;
  for (; i < n; ++i) {
    if (!kv.FindCachedPrefix(std::span(&hashes[i], 1)).empty()) {  // already resident
      ++stats.hits;
      continue;
    }
    if (!blocks[i].has_value()) break;
    absl::StatusOr<kv::ImportResult> r = kv::ImportBlocks(kv, *blocks[i]);
    // The block must be the one the handle names: a blob carrying another hash is refused.
    if (!r.ok() || kv.FindCachedPrefix(std::span(&hashes[i], 1)).empty()) break;
    ++stats.hits;
    stats.imported.push_back(i);
  }
  stats.misses = static_cast<int>(hashes.size()) - stats.hits;
  return stats;
}

}  // namespace tandem::engine
