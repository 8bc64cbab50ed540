#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tokenizer/tokenizer.h"

namespace tandem::tokenizer {

// Streams generated ids as text. Each Add returns only complete UTF-8 characters, holding back
// a character whose bytes are still arriving (byte-fallback <0xNN> tokens or byte-level tokens
// that split a character). Decoders with position-dependent rules (Strip, Metaspace's first
// space) are handled by decoding a short window that always starts at the same token and
// emitting only the difference, so the concatenated output equals Decode(all ids).
//
// One instance per sequence; not thread-safe. The Tokenizer must outlive it.
class IncrementalDetokenizer {
 public:
  IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens)
      : tokenizer_(tokenizer), skip_special_tokens_(skip_special_tokens) {}

  // Text that became complete with `id` (often empty while a character is incomplete).
  absl::StatusOr<std::string> Add(int32_t id);
  // End of stream: bytes still held back are emitted as U+FFFD.
  std::string Flush();

 private:
  const Tokenizer& tokenizer_;
  const bool skip_special_tokens_;
  std::vector<int32_t> ids_;
  size_t prefix_offset_ = 0;  // The window decoded each step starts here.
  size_t read_offset_ = 0;    // Ids up to here are fully emitted.
  size_t emitted_ = 0;        // Bytes past decode(ids_[prefix, read)) already emitted.
  std::string pending_;       // Held-back bytes, for Flush.
};

}  // namespace tandem::tokenizer
