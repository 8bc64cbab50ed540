#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace tandem::kv {

// Key of a full KV block in the prefix cache. Chained: the hash of block i covers the model, the
// hash of block i-1 and the tokens of block i, so equal hashes mean equal whole prefixes.
using BlockHash = uint64_t;

// XXH3-64 of the model id; every block hash is seeded with it so two models never share blocks.
// `weight_quantization` (empty for float weights) keeps the KV of a quantized model apart from
// the float model's under the same name.
uint64_t HashModelId(std::string_view model_id, std::string_view weight_quantization = "");
// The same, chained with the weights' fingerprint (model::ModelWeights::fingerprint) unless 0.
uint64_t HashModelId(std::string_view model_id, std::string_view weight_quantization,
                     uint64_t weights_fingerprint);

// h_i = XXH3_64(tokens of block i as little-endian int32, seed = XXH3_64(model_id_hash, prev)).
// `prev` is 0 for the first block, or a salt (see HashPrefixBlocks). Stable across processes and
// machines (little-endian hosts), which is what lets prefill and decode workers agree on block
// keys.
BlockHash HashBlock(uint64_t model_id_hash, BlockHash prev, std::span<const int32_t> tokens);

// A cache salt from text (a tenant, a request's cache_salt): XXH3-64, never 0. Blocks hashed
// from different salts never match, so one tenant cannot find another's prompts in a cache.
BlockHash CacheSaltOf(std::string_view text);
// Both salts in one: `a` alone or `b` alone when the other is 0, else a mix of the two (never 0).
BlockHash CombineCacheSalts(BlockHash a, BlockHash b);

// Chained hashes of every FULL block of `tokens` (a trailing partial block is not hashed). The
// chain starts from `salt` (0: no salt).
std::vector<BlockHash> HashPrefixBlocks(uint64_t model_hash, std::span<const int32_t> tokens,
                                        int block_size, BlockHash salt = 0);

}  // namespace tandem::kv
