#include "common/util/utf8.h"

#include "absl/strings/str_cat.h"

namespace tandem {
namespace {

bool IsCont(unsigned char c) { return (c & 0xC0) == 0x80; }

// Smallest allowed second byte for lead bytes with restricted ranges (Unicode table 3-7).
bool SecondByteOk(unsigned char lead, unsigned char second) {
  if (lead == 0xE0) return second >= 0xA0 && second <= 0xBF;
  if (lead == 0xED) return second >= 0x80 && second <= 0x9F;
  if (lead == 0xF0) return second >= 0x90 && second <= 0xBF;
  if (lead == 0xF4) return second >= 0x80 && second <= 0x8F;
  return IsCont(second);
}

}  // namespace

size_t Utf8SequenceLength(std::string_view text, size_t pos) {
  auto lead = static_cast<unsigned char>(text[pos]);
  if (lead < 0x80) return 1;
  size_t len = 0;
  if (lead >= 0xC2 && lead <= 0xDF) {
    len = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    len = 3;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    len = 4;
  } else {
    return 0;
  }
  if (pos + len > text.size()) return 0;
  if (!SecondByteOk(lead, static_cast<unsigned char>(text[pos + 1]))) return 0;
  for (size_t i = 2; i < len; ++i) {
    if (!IsCont(static_cast<unsigned char>(text[pos + i]))) return 0;
  }
  return len;
}

absl::Status ValidateUtf8(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    // ASCII fast path: most text is ASCII and needs no table lookups.
    if (static_cast<unsigned char>(text[pos]) < 0x80) {
      ++pos;
      continue;
    }
    size_t len = Utf8SequenceLength(text, pos);
    if (len == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("text is not valid UTF-8 at byte offset ", pos));
    }
    pos += len;
  }
  return absl::OkStatus();
}

char32_t DecodeUtf8(std::string_view text, size_t* pos) {
  auto c = static_cast<unsigned char>(text[*pos]);
  size_t len = Utf8LeadLength(c);
  if (*pos + len > text.size()) len = 1;
  char32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
  for (size_t i = 1; i < len; ++i) cp = (cp << 6) | (text[*pos + i] & 0x3F);
  *pos += len;
  return cp;
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string ToValidUtf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t pos = 0;
  while (pos < bytes.size()) {
    size_t len = Utf8SequenceLength(bytes, pos);
    if (len == 0) {
      out += "\xEF\xBF\xBD";
      ++pos;
      while (pos < bytes.size() && IsCont(static_cast<unsigned char>(bytes[pos]))) ++pos;
    } else {
      out.append(bytes.substr(pos, len));
      pos += len;
    }
  }
  return out;
}

size_t IncompleteUtf8Suffix(std::string_view bytes) {
  // Walk back over at most three continuation bytes to the lead byte.
  size_t n = bytes.size();
  for (size_t back = 1; back <= 4 && back <= n; ++back) {
    auto c = static_cast<unsigned char>(bytes[n - back]);
    if (IsCont(c)) continue;
    size_t need = Utf8LeadLength(c);
    if (c < 0xC2 || c > 0xF4) return 0;
    if (need <= back) return 0;
    // A prefix that can never complete (bad second byte) is not held back.
    if (back >= 2 && !SecondByteOk(c, static_cast<unsigned char>(bytes[n - back + 1]))) return 0;
    return back;
  }
  return 0;
}

}  // namespace tandem
