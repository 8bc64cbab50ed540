#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "common/tokenizer/merge_cache.h"
#include "nlohmann/json.hpp"

namespace tandem::tokenizer {

// The "model" of a BPE tokenizer.json: vocabulary, ranked merges, and the options real models
// set (byte_fallback, unk_token, fuse_unk, ignore_merges).
//
// Merging is a heap over adjacent symbol pairs (O(n log n) per word), so a megabyte-long word
// with no pre-tokenizer split (SentencePiece-style models) is still fast. Such words are also
// cut at U+2581 where no merge can cross the cut. Results for short words are memoized in a
// MergeCache. Encode is thread-safe.
class BpeModel {
 public:
  // `j` is the "model" object; errors name `source` and the offending key.
  static absl::StatusOr<std::unique_ptr<BpeModel>> Parse(const nlohmann::json& j,
                                                         const std::string& source);

  // Appends the ids of one pre-tokenized word.
  void Encode(std::string_view word, std::vector<int32_t>* out) const;

  // -1 when absent.
  int32_t TokenToId(std::string_view token) const;
  // Empty when `id` is not in the vocabulary.
  const std::string& IdToToken(int32_t id) const;
  // One past the largest id.
  int32_t vocab_size() const { return static_cast<int32_t>(id_to_token_.size()); }

 private:
  struct Merge {
    int32_t rank;
    int32_t new_id;
  };
  BpeModel() : cache_(1 << 16) {}
  absl::Status ParseVocab(const nlohmann::json& vocab, const std::string& source);
  absl::Status ParseMerges(const nlohmann::json& merges, const std::string& source);
  absl::Status AddMerge(std::string_view left, std::string_view right, int32_t rank,
                        const std::string& source);
  // Initial symbols: one per character, with byte fallback or unk for unknown characters.
  void InitialSymbols(std::string_view word, std::vector<int32_t>* ids) const;
  void MergeSymbols(std::vector<int32_t>* ids) const;
  void EncodeWord(std::string_view word, std::vector<int32_t>* out) const;
  // True when a word may be cut before the U+2581 at `pos` without changing the result.
  bool CanSplitBefore(std::string_view word, size_t pos) const;

  absl::flat_hash_map<std::string, int32_t> vocab_;
  std::vector<std::string> id_to_token_;
  absl::flat_hash_map<uint64_t, Merge> merges_;  // Key: left id << 32 | right id.
  int32_t byte_ids_[256];                        // <0xNN> tokens for byte_fallback, or -1.
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  bool fuse_unk_ = false;
  int32_t unk_id_ = -1;
  // SentencePiece-style words span whole sections (no pre-tokenizer split). When no merge
  // joins "<char>" + "\u2581..." the word can be cut before each U+2581 run, which makes the
  // pieces short and cacheable; merges that do join are recorded by their left character.
  bool metaspace_split_ = false;
  absl::flat_hash_set<std::string> joins_metaspace_after_;
  mutable MergeCache cache_;
};

}  // namespace tandem::tokenizer
