#include "common/kv/block_hash.h"

#include <xxhash.h>

#include <cstring>

namespace tandem::kv {

uint64_t HashModelId(std::string_view model_id, std::string_view weight_quantization) {
  const uint64_t id = XXH3_64bits(model_id.data(), model_id.size());
  if (weight_quantization.empty()) return id;
  return XXH3_64bits_withSeed(weight_quantization.data(), weight_quantization.size(), id);
}

uint64_t HashModelId(std::string_view model_id, std::string_view weight_quantization,
                     uint64_t weights_fingerprint) {
  const uint64_t id = HashModelId(model_id, weight_quantization);
  if (weights_fingerprint == 0) return id;
  return XXH3_64bits_withSeed(&weights_fingerprint, sizeof(weights_fingerprint), id);
}

BlockHash HashBlock(uint64_t model_id_hash, BlockHash prev, std::span<const int32_t> tokens) {
  // Two fixed-size hashes instead of concatenating into a buffer: no allocation on the hot path.
  uint64_t seed_input[2] = {model_id_hash, prev};
  const uint64_t seed = XXH3_64bits(seed_input, sizeof(seed_input));
  return XXH3_64bits_withSeed(tokens.data(), tokens.size_bytes(), seed);
}

BlockHash CacheSaltOf(std::string_view text) {
  const BlockHash salt = XXH3_64bits_withSeed(text.data(), text.size(), 0x7a6e6e7473616c74);
  return salt == 0 ? 1 : salt;
}

BlockHash CombineCacheSalts(BlockHash a, BlockHash b) {
  if (a == 0 || b == 0) return a | b;
  const uint64_t both[2] = {a, b};
  const BlockHash salt = XXH3_64bits(both, sizeof(both));
  return salt == 0 ? 1 : salt;
}

std::vector<BlockHash> HashPrefixBlocks(uint64_t model_hash, std::span<const int32_t> tokens,
                                        int block_size, BlockHash salt) {
  std::vector<BlockHash> hashes;
  if (block_size <= 0) return hashes;
  const size_t num_full = tokens.size() / static_cast<size_t>(block_size);
  hashes.reserve(num_full);
  BlockHash prev = salt;
  for (size_t i = 0; i < num_full; ++i) {
    prev = HashBlock(model_hash, prev, tokens.subspan(i * block_size, block_size));
    hashes.push_back(prev);
  }
  return hashes;
}

}  // namespace tandem::kv
