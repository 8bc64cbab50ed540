#pragma once

#include <bitset>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace tandem::tokenizer {

// One entry of tokenizer.json "added_tokens".
struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false;
  bool lstrip = false;       // Swallows whitespace before the token.
  bool rstrip = false;       // Swallows whitespace after the token.
  bool single_word = false;  // Matches only when not inside a word.
  bool normalized = false;   // Matched after the normalizer instead of on raw text.
};

// A piece of input: ordinary text (id < 0) or one added token.
struct TextSegment {
  std::string_view text;
  int32_t id = -1;
};

// Finds added tokens in raw input before normalization and BPE, leftmost-longest, as Hugging
// Face tokenizers do: at each position the longest token wins, and text between tokens is
// passed on. A byte trie keeps this linear in the input length for thousands of tokens.
// Immutable after construction, so shareable between threads.
class AddedTokenMatcher {
 public:
  explicit AddedTokenMatcher(const std::vector<AddedToken>& tokens);

  // Splits `text` (views into it). Text segments may be empty after lstrip/rstrip.
  std::vector<TextSegment> Split(std::string_view text) const;

 private:
  struct Match {
    size_t length = 0;
    int token = -1;  // Index into tokens_.
  };
  Match LongestAt(std::string_view text, size_t pos) const;
  bool WordBoundaryOk(std::string_view text, size_t begin, size_t end) const;

  std::vector<AddedToken> tokens_;
  // Trie edges: (node << 8 | byte) -> child node. Node 0 is the root.
  absl::flat_hash_map<uint64_t, int32_t> edges_;
  std::vector<int32_t> terminal_;  // Per node: token index ending here, or -1.
  std::bitset<256> first_bytes_;   // Bytes that can start a token: a fast skip for plain text.
};

}  // namespace tandem::tokenizer
