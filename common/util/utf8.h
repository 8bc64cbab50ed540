#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace tandem {

// InvalidArgument naming the first byte offset that is not well-formed UTF-8
// (overlong forms, surrogates and code points above U+10FFFF are rejected).
absl::Status ValidateUtf8(std::string_view text);

// Length of the well-formed UTF-8 sequence starting at text[pos], or 0 if there is none.
size_t Utf8SequenceLength(std::string_view text, size_t pos);

// Byte length of a character given its lead byte (1 for continuation or invalid bytes).
inline size_t Utf8LeadLength(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead & 0xE0) == 0xC0) return 2;
  if ((lead & 0xF0) == 0xE0) return 3;
  if ((lead & 0xF8) == 0xF0) return 4;
  return 1;
}

// Decodes one code point from valid UTF-8 at text[*pos] and advances *pos.
char32_t DecodeUtf8(std::string_view text, size_t* pos);
void AppendUtf8(char32_t cp, std::string* out);

// Replaces every ill-formed sequence with U+FFFD, as a lossy decoder does.
std::string ToValidUtf8(std::string_view bytes);

// Bytes at the end of `bytes` that begin a UTF-8 sequence which later bytes could still
// complete (0..3). Used by streaming decode to hold back a partial character.
size_t IncompleteUtf8Suffix(std::string_view bytes);

}  // namespace tandem
