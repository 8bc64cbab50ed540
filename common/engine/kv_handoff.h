// The prefill -> decode handoff of a prompt's KV cache, on either side of the cache store.
//
// Prefill: once a request has finished prefill (its first token sampled), its full prompt
// blocks sit in the engine's prefix cache under their chained hashes; ExportPromptBlocks
// serialises each one (kv_transfer format: bytes + layout descriptor + checksum), so a block
// is a self-describing store entry. Decode: ImportPromptBlocks copies fetched blocks into the
// engine's prefix cache, after which the request — resumed with its first token
// (Request::num_generated) — is admitted with those blocks mapped and computes only the
// partial last block.
//
// Both run on the engine's thread (EngineLoop callbacks or tasks), between steps.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/engine/engine.h"
#include "common/kv/block_hash.h"

namespace tandem::engine {

struct ExportedBlock {
  kv::BlockHash hash = 0;
  std::string bytes;  // one block in the kv_transfer format
};

// What ExportPromptBlocks will give for a prompt, known before the prompt is computed and
// computable on any thread: the blocks' hashes and the bytes of each. A prefill worker reserves
// the blocks' space in the cache store with it while the engine computes (PrefillService). Taken
// from the engine on its thread (Of); a copy of immutable facts after that.
class ExportPlan {
 public:
  static ExportPlan Of(const Engine& engine);

  // The full blocks' hashes under the request's own cache salt, as ExportPromptBlocks keys them.
  std::vector<kv::BlockHash> Hashes(std::span<const int32_t> prompt, uint64_t request_salt) const;
  // The bytes of each exported block; 0 where they vary by block (a mixed-precision cache).
  int64_t block_bytes() const { return block_bytes_; }

 private:
  uint64_t model_hash_ = 0;
  int block_size_ = 0;
  std::optional<model::PruningSettings> pruning_;  // the engine prunes (Engine::CacheSalt)
  int64_t block_bytes_ = 0;
};

// The chained hashes of the full blocks of `prompt` in this engine's cache (model and block
// size, from the request's cache salt), which is also the key list of the KV handle.
std::vector<kv::BlockHash> PromptBlockHashes(Engine& engine, std::span<const int32_t> prompt,
                                             uint64_t cache_salt = 0);

// Exports the cached prefix of `prompt`'s full blocks, in order, stopping at the first block
// not in the prefix cache (so the result is always a usable prefix).
absl::StatusOr<std::vector<ExportedBlock>> ExportPromptBlocks(Engine& engine,
                                                              std::span<const int32_t> prompt,
                                                              uint64_t cache_salt = 0);

struct ImportStats {
  int hits = 0;    // blocks now usable: already resident, or imported
  int misses = 0;  // blocks absent (nullopt) or refused; the first one ends the usable prefix
  std::vector<size_t> imported;  // indices of the hits that were imported (not resident)
};

// Imports `blocks[i]` for hashes[i] in order, stopping at the first missing or refused block
// (a later block is useless without the ones before it). A block whose bytes fail validation
// (other model, dtype or geometry, corruption) is refused, counted as a miss, and leaves the
// cache untouched.
ImportStats ImportPromptBlocks(Engine& engine, std::span<const kv::BlockHash> hashes,
                               std::span<const std::optional<std::string>> blocks);

}  // namespace tandem::engine
