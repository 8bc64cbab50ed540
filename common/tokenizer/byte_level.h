#pragma once

#include <array>
#include <string>
#include <string_view>

#include "absl/container/flat_hash_map.h"

namespace tandem::tokenizer {

// GPT-2's reversible byte <-> printable-character mapping used by byte-level BPE: printable
// Latin-1 bytes map to themselves, the other 68 bytes to U+0100 upwards, so every byte
// sequence becomes a string of visible characters the vocabulary can hold.
class ByteLevelTable {
 public:
  static const ByteLevelTable& Get();

  // UTF-8 of the character standing for byte `b`.
  const std::string& Encode(unsigned char b) const { return byte_to_utf8_[b]; }
  // Appends the mapped characters of every byte in `bytes` to `out`.
  void EncodeAppend(std::string_view bytes, std::string* out) const;
  // Maps characters back to bytes; characters outside the table are kept as their UTF-8.
  std::string Decode(std::string_view text) const;

 private:
  ByteLevelTable();
  std::array<std::string, 256> byte_to_utf8_;
  absl::flat_hash_map<char32_t, unsigned char> char_to_byte_;
};

}  // namespace tandem::tokenizer
