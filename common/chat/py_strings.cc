#include "common/chat/py_strings.h"

#include <algorithm>

#include "common/util/utf8.h"
#include "utf8proc.h"

namespace tandem::chat {
namespace {

int Category(char32_t c) { return utf8proc_category(static_cast<utf8proc_int32_t>(c)); }

// Appends the character s[begin, end) mapped by `map`, keeping ill-formed bytes as they are.
template <typename Map>
void AppendMapped(std::string_view s, size_t begin, size_t end, char32_t c, Map map,
                  std::string* out) {
  if (end - begin == 1 && static_cast<unsigned char>(s[begin]) >= 0x80) {
    out->push_back(s[begin]);  // ill-formed byte
    return;
  }
  char32_t m = map(c);
  if (m == c) {
    out->append(s.substr(begin, end - begin));
  } else {
    AppendUtf8(m, out);
  }
}

char32_t ToUpper(char32_t c) { return utf8proc_toupper(static_cast<utf8proc_int32_t>(c)); }
char32_t ToLower(char32_t c) { return utf8proc_tolower(static_cast<utf8proc_int32_t>(c)); }
char32_t ToTitle(char32_t c) { return utf8proc_totitle(static_cast<utf8proc_int32_t>(c)); }

bool InChars(char32_t c, const std::vector<char32_t>& chars) {
  return std::find(chars.begin(), chars.end(), c) != chars.end();
}

std::vector<char32_t> Decode(std::string_view s) {
  std::vector<char32_t> out;
  for (size_t pos = 0; pos < s.size();) out.push_back(NextCodePoint(s, &pos));
  return out;
}

}  // namespace

char32_t NextCodePoint(std::string_view s, size_t* pos) {
  size_t len = Utf8SequenceLength(s, *pos);
  if (len == 0) {
    return static_cast<unsigned char>(s[(*pos)++]);
  }
  return DecodeUtf8(s, pos);
}

size_t CodePointCount(std::string_view s) {
  size_t n = 0;
  for (size_t pos = 0; pos < s.size(); ++n) NextCodePoint(s, &pos);
  return n;
}

std::vector<size_t> CodePointOffsets(std::string_view s) {
  std::vector<size_t> out;
  size_t pos = 0;
  while (pos < s.size()) {
    out.push_back(pos);
    NextCodePoint(s, &pos);
  }
  out.push_back(s.size());
  return out;
}

size_t CodePointIndex(std::string_view s, size_t byte_pos) {
  return CodePointCount(s.substr(0, std::min(byte_pos, s.size())));
}

bool IsPySpace(char32_t c) {
  if (c < 0x80) return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20);
  return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
         c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

bool IsPyPrintable(char32_t c) {
  if (c < 0x80) return c >= 0x20 && c < 0x7F;
  switch (Category(c)) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS:
      return false;
    default:
      return true;
  }
}

bool IsPyAlpha(char32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
  int cat = Category(c);
  return cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO;
}

bool IsPyDigit(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  return Category(c) == UTF8PROC_CATEGORY_ND;
}

bool IsPyWordChar(char32_t c) {
  if (c == '_' || IsPyAlpha(c) || IsPyDigit(c)) return true;
  int cat = Category(c);
  return cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_NO;
}

bool IsPyCased(char32_t c) {
  int cat = Category(c);
  return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL ||
         cat == UTF8PROC_CATEGORY_LT || ToUpper(c) != c || ToLower(c) != c;
}

bool IsPyLower(char32_t c) { return utf8proc_islower(static_cast<utf8proc_int32_t>(c)); }
bool IsPyUpper(char32_t c) { return utf8proc_isupper(static_cast<utf8proc_int32_t>(c)); }

std::string PyStrip(std::string_view s, const std::optional<std::string>& chars, bool left,
                    bool right) {
  std::vector<char32_t> set;
  if (chars) set = Decode(*chars);
  auto strip = [&](char32_t c) { return chars ? InChars(c, set) : IsPySpace(c); };
  std::vector<size_t> offsets = CodePointOffsets(s);
  size_t n = offsets.size() - 1;
  size_t b = 0, e = n;
  auto at = [&](size_t i) {
    size_t p = offsets[i];
    return NextCodePoint(s, &p);
  };
  if (left) {
    while (b < e && strip(at(b))) ++b;
  }
  if (right) {
    while (e > b && strip(at(e - 1))) --e;
  }
  return std::string(s.substr(offsets[b], offsets[e] - offsets[b]));
}

std::string PyUpper(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t pos = 0; pos < s.size();) {
    size_t begin = pos;
    char32_t c = NextCodePoint(s, &pos);
    AppendMapped(s, begin, pos, c, ToUpper, &out);
  }
  return out;
}

std::string PyLower(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t pos = 0; pos < s.size();) {
    size_t begin = pos;
    char32_t c = NextCodePoint(s, &pos);
    AppendMapped(s, begin, pos, c, ToLower, &out);
  }
  return out;
}

std::string PyCapitalize(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t pos = 0; pos < s.size();) {
    size_t begin = pos;
    char32_t c = NextCodePoint(s, &pos);
    AppendMapped(s, begin, pos, c, begin == 0 ? ToTitle : ToLower, &out);
  }
  return out;
}

std::string PyTitle(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  bool previous_cased = false;
  for (size_t pos = 0; pos < s.size();) {
    size_t begin = pos;
    char32_t c = NextCodePoint(s, &pos);
    AppendMapped(s, begin, pos, c, previous_cased ? ToLower : ToTitle, &out);
    previous_cased = IsPyCased(c);
  }
  return out;
}

std::string JinjaTitle(std::string_view s) {
  // Jinja: "".join(w[0].upper() + w[1:].lower() for w in re.split(r"([-\s({\[<]+)", s)).
  std::string out;
  out.reserve(s.size());
  bool word_start = true;
  for (size_t pos = 0; pos < s.size();) {
    size_t begin = pos;
    char32_t c = NextCodePoint(s, &pos);
    bool sep = IsPySpace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
    if (sep) {
      out.append(s.substr(begin, pos - begin));
      word_start = true;
      continue;
    }
    AppendMapped(s, begin, pos, c, word_start ? ToUpper : ToLower, &out);
    word_start = false;
  }
  return out;
}

std::vector<std::string> PySplit(std::string_view s, const std::optional<std::string>& sep,
                                 int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    size_t start = 0;
    while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
      size_t hit = s.find(*sep, start);
      if (hit == std::string_view::npos) break;
      out.emplace_back(s.substr(start, hit - start));
      start = hit + sep->size();
    }
    out.emplace_back(s.substr(start));
    return out;
  }
  size_t pos = 0;
  auto skip_space = [&]() {
    while (pos < s.size()) {
      size_t p = pos;
      if (!IsPySpace(NextCodePoint(s, &p))) break;
      pos = p;
    }
  };
  skip_space();
  while (pos < s.size()) {
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) >= maxsplit) {
      out.emplace_back(s.substr(pos));  // the rest, trailing whitespace included
      return out;
    }
    size_t begin = pos;
    while (pos < s.size()) {
      size_t p = pos;
      if (IsPySpace(NextCodePoint(s, &p))) break;
      pos = p;
    }
    out.emplace_back(s.substr(begin, pos - begin));
    skip_space();
  }
  return out;
}

std::vector<std::string> PyRSplit(std::string_view s, const std::optional<std::string>& sep,
                                  int64_t maxsplit) {
  if (maxsplit < 0) return PySplit(s, sep, maxsplit);
  std::vector<std::string> out;
  if (sep) {
    size_t end = s.size();
    while (static_cast<int64_t>(out.size()) < maxsplit && end >= sep->size()) {
      size_t hit = s.substr(0, end).rfind(*sep);
      if (hit == std::string_view::npos) break;
      out.emplace_back(s.substr(hit + sep->size(), end - hit - sep->size()));
      end = hit;
    }
    out.emplace_back(s.substr(0, end));
  } else {
    std::vector<size_t> offsets = CodePointOffsets(s);
    auto space = [&](size_t i) {
      size_t p = offsets[i];
      return IsPySpace(NextCodePoint(s, &p));
    };
    size_t e = offsets.size() - 1;
    while (e > 0 && space(e - 1)) --e;
    while (e > 0) {
      if (static_cast<int64_t>(out.size()) >= maxsplit) {
        out.emplace_back(s.substr(0, offsets[e]));
        break;
      }
      size_t b = e;
      while (b > 0 && !space(b - 1)) --b;
      out.emplace_back(s.substr(offsets[b], offsets[e] - offsets[b]));
      e = b;
      while (e > 0 && space(e - 1)) --e;
    }
  }
  std::reverse(out.begin(), out.end());
  return out;
}

std::vector<std::string> PySplitLines(std::string_view s, bool keepends) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t pos = 0; pos < s.size();) {
    size_t begin = pos;
    char32_t c = NextCodePoint(s, &pos);
    bool is_break = c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D ||
                    c == 0x1E || c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!is_break) continue;
    if (c == '\r' && pos < s.size() && s[pos] == '\n') ++pos;
    out.emplace_back(s.substr(start, (keepends ? pos : begin) - start));
    start = pos;
  }
  if (start < s.size()) out.emplace_back(s.substr(start));
  return out;
}

std::string PyReplace(std::string_view s, std::string_view old_s, std::string_view new_s,
                      int64_t count) {
  std::string out;
  int64_t done = 0;
  if (old_s.empty()) {
    // Python inserts `new` before every character and at the end.
    size_t pos = 0;
    while (pos <= s.size()) {
      if (count >= 0 && done >= count) break;
      out.append(new_s);
      ++done;
      if (pos == s.size()) {
        pos = s.size() + 1;
        break;
      }
      size_t begin = pos;
      NextCodePoint(s, &pos);
      out.append(s.substr(begin, pos - begin));
    }
    if (pos <= s.size()) out.append(s.substr(pos));
    return out;
  }
  size_t start = 0;
  while (count < 0 || done < count) {
    size_t hit = s.find(old_s, start);
    if (hit == std::string_view::npos) break;
    out.append(s.substr(start, hit - start));
    out.append(new_s);
    start = hit + old_s.size();
    ++done;
  }
  out.append(s.substr(start));
  return out;
}

size_t PyCount(std::string_view s, std::string_view sub) {
  if (sub.empty()) return CodePointCount(s) + 1;
  size_t n = 0;
  for (size_t pos = s.find(sub); pos != std::string_view::npos; pos = s.find(sub, pos)) {
    ++n;
    pos += sub.size();
  }
  return n;
}

void PyCodePointRange(std::string_view s, std::optional<int64_t> start, std::optional<int64_t> end,
                      size_t* begin, size_t* stop) {
  std::vector<size_t> offsets = CodePointOffsets(s);
  int64_t n = static_cast<int64_t>(offsets.size()) - 1;
  auto clamp = [n](int64_t i) {
    if (i < 0) i += n;
    return std::clamp<int64_t>(i, 0, n);
  };
  int64_t b = start ? clamp(*start) : 0;
  int64_t e = end ? clamp(*end) : n;
  if (e < b) e = b;
  *begin = offsets[static_cast<size_t>(b)];
  *stop = offsets[static_cast<size_t>(e)];
}

}  // namespace tandem::chat
