// Python's str semantics on UTF-8 bytes: lengths and indexes count code points, whitespace and
// case follow Unicode (via utf8proc; simple case mappings, so 'ß'.upper() stays 'ß'). Bytes
// that are not well-formed UTF-8 count as one character each and are kept as they are.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::chat {

// Decodes the character at s[*pos] and advances *pos past it.
char32_t NextCodePoint(std::string_view s, size_t* pos);
size_t CodePointCount(std::string_view s);
// Byte offset of every character, plus s.size() at the end.
std::vector<size_t> CodePointOffsets(std::string_view s);
// Code point index of byte offset `byte_pos` (which starts a character).
size_t CodePointIndex(std::string_view s, size_t byte_pos);

bool IsPySpace(char32_t c);      // str.isspace()
bool IsPyPrintable(char32_t c);  // str.isprintable()
bool IsPyWordChar(char32_t c);   // regex \w
bool IsPyAlpha(char32_t c);
bool IsPyDigit(char32_t c);
bool IsPyCased(char32_t c);
bool IsPyLower(char32_t c);
bool IsPyUpper(char32_t c);

// str.strip / lstrip / rstrip; `chars` unset strips whitespace.
std::string PyStrip(std::string_view s, const std::optional<std::string>& chars, bool left,
                    bool right);
std::string PyUpper(std::string_view s);
std::string PyLower(std::string_view s);
std::string PyCapitalize(std::string_view s);  // str.capitalize()
std::string PyTitle(std::string_view s);       // str.title()
std::string JinjaTitle(std::string_view s);    // the `title` filter (splits on space, -, brackets)

// str.split / rsplit; `sep` unset splits on runs of whitespace. maxsplit < 0: no limit.
std::vector<std::string> PySplit(std::string_view s, const std::optional<std::string>& sep,
                                 int64_t maxsplit);
std::vector<std::string> PyRSplit(std::string_view s, const std::optional<std::string>& sep,
                                  int64_t maxsplit);
std::vector<std::string> PySplitLines(std::string_view s, bool keepends);
// str.replace; count < 0: all.
std::string PyReplace(std::string_view s, std::string_view old_s, std::string_view new_s,
                      int64_t count);
// Non-overlapping occurrences of `sub` (an empty `sub` counts len + 1).
size_t PyCount(std::string_view s, std::string_view sub);
// Byte range [*begin, *end) of the code point range [start, end) after Python's clamping of
// negative and out-of-range indexes.
void PyCodePointRange(std::string_view s, std::optional<int64_t> start, std::optional<int64_t> end,
                      size_t* begin, size_t* stop);

}  // namespace tandem::chat
