#include "common/chat/jinja_lexer.h"

#include <cctype>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/chat/py_strings.h"
#include "common/util/utf8.h"

namespace tandem::chat {
namespace {

// Jinja's lexer normalizes every newline to "\n" and drops one trailing newline.
std::string Normalize(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
      out.push_back('\n');
    } else {
      out.push_back(source[i]);
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

bool IsHexDigit(char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsNameStart(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool IsNameChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// Decodes the Python escape sequence at src[*p] (a backslash) into *out, as Jinja does with
// "unicode-escape"; unknown escapes stay as written.
absl::Status DecodeEscape(std::string_view src, size_t* p, std::string* out) {
  char e = src[*p + 1];
  *p += 2;
  static constexpr std::string_view kFrom = "\n\\'\"ntrabfv";
  static constexpr char kTo[] = "\0\\'\"\n\t\r\a\b\f\v";
  if (size_t i = kFrom.find(e); i != std::string_view::npos) {
    if (i > 0) out->push_back(kTo[i]);  // backslash-newline is a line continuation
    return absl::OkStatus();
  }
  if (e == 'x' || e == 'u' || e == 'U') {
    int digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
    char32_t cp = 0;
    for (int i = 0; i < digits; ++i, ++*p) {
      if (*p >= src.size() || !IsHexDigit(src[*p])) {
        return absl::InvalidArgumentError(
            absl::StrCat("truncated \\", std::string(1, e), " escape"));
      }
      char h = static_cast<char>(std::tolower(static_cast<unsigned char>(src[*p])));
      cp = cp * 16 + static_cast<char32_t>(h <= '9' ? h - '0' : h - 'a' + 10);
    }
    if (cp > 0x10FFFF) {
      return absl::InvalidArgumentError("illegal Unicode character in string literal");
    }
    AppendUtf8(cp >= 0xD800 && cp <= 0xDFFF ? 0xFFFD : cp, out);
    return absl::OkStatus();
  }
  if (e >= '0' && e <= '7') {
    char32_t v = static_cast<char32_t>(e - '0');
    for (int i = 0; i < 2 && *p < src.size() && src[*p] >= '0' && src[*p] <= '7'; ++i) {
      v = v * 8 + static_cast<char32_t>(src[(*p)++] - '0');
    }
    AppendUtf8(v, out);
    return absl::OkStatus();
  }
  out->push_back('\\');
  out->push_back(e);
  return absl::OkStatus();
}

class Lexer {
 public:
  Lexer(std::string_view source, const std::string& name) : src_(Normalize(source)), name_(name) {}

  absl::StatusOr<std::vector<Token>> Run();

 private:
  absl::Status Error(size_t pos, std::string_view msg) {
    return absl::InvalidArgumentError(
        absl::StrCat(name_, " line ", LineAt(pos), ": ", std::string(msg)));
  }
  // Line of byte `pos`; positions are asked for in increasing order.
  int LineAt(size_t pos) {
    for (; line_pos_ < pos && line_pos_ < src_.size(); ++line_pos_) {
      if (src_[line_pos_] == '\n') ++line_;
    }
    return line_;
  }
  bool StartsWith(size_t pos, std::string_view s) const {
    return src_.compare(pos, s.size(), s) == 0;
  }
  size_t SkipSpaces(size_t pos) const;
  size_t FindTagStart(size_t from) const;
  std::string_view LeftControl(std::string_view text, char ctrl, bool is_var) const;
  void EmitText(std::string_view text, size_t pos);
  bool MatchRaw(size_t pos, std::string_view word, size_t* end, char* begin_ctrl,
                char* end_ctrl) const;
  absl::Status LexComment(size_t body);
  absl::Status LexRaw(size_t raw_begin, size_t after, char end_ctrl);
  absl::Status LexTag(bool block);
  absl::Status LexString();
  void LexNumber();
  absl::Status LexOperator();

  std::string src_;
  const std::string& name_;
  size_t pos_ = 0;
  size_t line_pos_ = 0;
  int line_ = 1;
  std::vector<char> brackets_;
  std::vector<Token> out_;
};

size_t Lexer::SkipSpaces(size_t pos) const {
  while (pos < src_.size()) {
    size_t next = pos;
    if (!IsPySpace(NextCodePoint(src_, &next))) break;
    pos = next;
  }
  return pos;
}

size_t Lexer::FindTagStart(size_t from) const {
  for (size_t p = src_.find('{', from); p != std::string::npos; p = src_.find('{', p + 1)) {
    if (p + 1 < src_.size() && std::strchr("{%#", src_[p + 1]) != nullptr) return p;
  }
  return std::string::npos;
}

// Whitespace control on the text before a tag: '-' strips all trailing whitespace;
// lstrip_blocks strips spaces between a line start and a block or comment tag.
std::string_view Lexer::LeftControl(std::string_view text, char ctrl, bool is_var) const {
  if (ctrl == '-') {
    size_t end = text.size();
    while (end > 0) {
      size_t start = end - 1;
      while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
      size_t p = start;
      if (!IsPySpace(NextCodePoint(text, &p))) break;
      end = start;
    }
    return text.substr(0, end);
  }
  if (ctrl == '+' || is_var) return text;
  size_t l_pos = text.rfind('\n');
  l_pos = l_pos == std::string_view::npos ? 0 : l_pos + 1;
  size_t text_start = pos_;
  bool line_starting = text_start == 0 || src_[text_start - 1] == '\n';
  if (l_pos == 0 && !line_starting) return text;
  if (l_pos == text.size()) return text;
  for (size_t p = l_pos; p < text.size();) {
    if (!IsPySpace(NextCodePoint(text, &p))) return text;
  }
  return text.substr(0, l_pos);
}

void Lexer::EmitText(std::string_view text, size_t pos) {
  if (text.empty()) return;
  out_.push_back({TokenType::kText, std::string(text), LineAt(pos)});
}

// Matches "{%[-+]? word [-+]?%}" at pos (word: raw or endraw).
bool Lexer::MatchRaw(size_t pos, std::string_view word, size_t* end, char* begin_ctrl,
                     char* end_ctrl) const {
  if (!StartsWith(pos, "{%")) return false;
  size_t p = pos + 2;
  *begin_ctrl = 0;
  if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) *begin_ctrl = src_[p++];
  p = SkipSpaces(p);
  if (!StartsWith(p, word)) return false;
  p += word.size();
  if (p < src_.size() && IsNameChar(src_[p])) return false;
  p = SkipSpaces(p);
  *end_ctrl = 0;
  if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) *end_ctrl = src_[p++];
  if (!StartsWith(p, "%}")) return false;
  *end = p + 2;
  return true;
}

absl::Status Lexer::LexComment(size_t body) {
  size_t end = src_.find("#}", body);
  if (end == std::string::npos) return Error(body, "unclosed comment: missing '#}'");
  char ctrl = end > body ? src_[end - 1] : 0;
  pos_ = end + 2;
  if (ctrl == '-') {
    pos_ = SkipSpaces(pos_);
  } else if (ctrl != '+' && pos_ < src_.size() && src_[pos_] == '\n') {
    ++pos_;  // trim_blocks
  }
  return absl::OkStatus();
}

absl::Status Lexer::LexRaw(size_t raw_begin, size_t after, char end_ctrl) {
  size_t body = end_ctrl == '-' ? SkipSpaces(after) : after;
  for (size_t p = src_.find("{%", body); p != std::string::npos; p = src_.find("{%", p + 1)) {
    size_t end;
    char begin_ctrl, close_ctrl;
    if (!MatchRaw(p, "endraw", &end, &begin_ctrl, &close_ctrl)) continue;
    pos_ = body;
    EmitText(LeftControl(std::string_view(src_).substr(body, p - body), begin_ctrl, false), body);
    pos_ = end;
    if (close_ctrl == '-') {
      pos_ = SkipSpaces(pos_);
    } else if (close_ctrl != '+' && pos_ < src_.size() && src_[pos_] == '\n') {
      ++pos_;
    }
    return absl::OkStatus();
  }
  return Error(raw_begin, "missing end of raw directive: no '{% endraw %}'");
}

absl::Status Lexer::LexString() {
  char quote = src_[pos_];
  size_t start = pos_;
  std::string value;
  size_t p = pos_ + 1;
  while (true) {
    if (p >= src_.size()) return Error(start, "unterminated string literal");
    char c = src_[p];
    if (c == quote) break;
    if (c != '\\' || p + 1 >= src_.size()) {
      value.push_back(c);
      ++p;
      continue;
    }
    if (auto s = DecodeEscape(src_, &p, &value); !s.ok()) {
      return Error(start, std::string(s.message()));
    }
  }
  out_.push_back({TokenType::kString, std::move(value), LineAt(start)});
  pos_ = p + 1;
  return absl::OkStatus();
}

void Lexer::LexNumber() {
  size_t p = pos_;
  auto digits = [&](size_t q) {
    if (q >= src_.size() || !IsDigit(src_[q])) return q;
    ++q;
    while (q < src_.size() &&
           (IsDigit(src_[q]) || (src_[q] == '_' && q + 1 < src_.size() && IsDigit(src_[q + 1])))) {
      ++q;
    }
    return q;
  };
  auto exponent = [&](size_t q) {
    if (q < src_.size() && (src_[q] == 'e' || src_[q] == 'E')) {
      size_t r = q + 1;
      if (r < src_.size() && (src_[r] == '+' || src_[r] == '-')) ++r;
      size_t e = digits(r);
      if (e > r) return e;
    }
    return q;
  };
  bool after_dot = pos_ > 0 && src_[pos_ - 1] == '.';
  size_t int_end = digits(p);
  size_t end = int_end;
  bool is_float = false;
  if (!after_dot) {
    if (end + 1 < src_.size() && src_[end] == '.' && IsDigit(src_[end + 1])) {
      end = exponent(digits(end + 1));
      is_float = true;
    } else if (size_t e = exponent(end); e > end) {
      end = e;
      is_float = true;
    }
  }
  if (!is_float) {
    // Jinja: 0x.., 0o.., 0b.., or a decimal with no leading zero ("012" is "0" then "12").
    char base = p + 1 < src_.size() ? static_cast<char>(std::tolower(src_[p + 1])) : 0;
    if (src_[p] == '0' && (base == 'x' || base == 'o' || base == 'b')) {
      size_t q = p + 2;
      auto ok = [&](char c) {
        if (base == 'x') return IsHexDigit(c);
        return base == 'o' ? (c >= '0' && c <= '7') : (c == '0' || c == '1');
      };
      while (q < src_.size() &&
             (ok(src_[q]) || (src_[q] == '_' && q + 1 < src_.size() && ok(src_[q + 1])))) {
        ++q;
      }
      if (q > p + 2) end = q;
    } else if (src_[p] == '0') {
      end = p + 1;
      while (end < src_.size() && (src_[end] == '0' || (src_[end] == '_' && end + 1 < src_.size() &&
                                                        src_[end + 1] == '0'))) {
        ++end;
      }
    }
  }
  out_.push_back(
      {is_float ? TokenType::kFloat : TokenType::kInteger, src_.substr(p, end - p), LineAt(p)});
  pos_ = end;
}

absl::Status Lexer::LexOperator() {
  static constexpr std::string_view kTwo[] = {"//", "**", "==", "!=", "<=", ">="};
  for (std::string_view op : kTwo) {
    if (StartsWith(pos_, op)) {
      out_.push_back({TokenType::kOperator, std::string(op), LineAt(pos_)});
      pos_ += 2;
      return absl::OkStatus();
    }
  }
  char c = src_[pos_];
  if (std::strchr("+-*/%~()[]{},.:|<>=", c) == nullptr) {
    size_t p = pos_;
    NextCodePoint(src_, &p);
    return Error(pos_,
                 absl::StrCat("unexpected character '", src_.substr(pos_, p - pos_), "' in tag"));
  }
  if (c == '(' || c == '[' || c == '{') {
    if (brackets_.size() >= static_cast<size_t>(kMaxBracketDepth)) {
      return Error(pos_, "brackets nested too deeply");
    }
    brackets_.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
  } else if (c == ')' || c == ']' || c == '}') {
    if (brackets_.empty() || brackets_.back() != c) {
      return Error(pos_, absl::StrCat("unexpected '", std::string(1, c), "'"));
    }
    brackets_.pop_back();
  }
  out_.push_back({TokenType::kOperator, std::string(1, c), LineAt(pos_)});
  ++pos_;
  return absl::OkStatus();
}

absl::Status Lexer::LexTag(bool block) {
  size_t tag_start = pos_;
  brackets_.clear();
  while (true) {
    pos_ = SkipSpaces(pos_);
    if (pos_ >= src_.size()) {
      return Error(tag_start, block ? "unclosed tag: missing '%}'" : "unclosed tag: missing '}}'");
    }
    if (brackets_.empty()) {
      std::string_view close = block ? "%}" : "}}";
      char ctrl = src_[pos_];
      bool with_ctrl = (ctrl == '-' || (block && ctrl == '+')) && StartsWith(pos_ + 1, close);
      if (with_ctrl || StartsWith(pos_, close)) {
        out_.push_back({block ? TokenType::kBlockEnd : TokenType::kVarEnd, "", LineAt(pos_)});
        pos_ += close.size() + (with_ctrl ? 1 : 0);
        if (with_ctrl && ctrl == '-') {
          pos_ = SkipSpaces(pos_);
        } else if (block && !with_ctrl && pos_ < src_.size() && src_[pos_] == '\n') {
          ++pos_;  // trim_blocks
        }
        return absl::OkStatus();
      }
    }
    char c = src_[pos_];
    if (c == '\'' || c == '"') {
      if (auto s = LexString(); !s.ok()) return s;
    } else if (IsDigit(c)) {
      LexNumber();
    } else if (IsNameStart(c)) {
      size_t p = pos_;
      while (p < src_.size() && IsNameChar(src_[p])) ++p;
      out_.push_back({TokenType::kName, src_.substr(pos_, p - pos_), LineAt(pos_)});
      pos_ = p;
    } else if (auto s = LexOperator(); !s.ok()) {
      return s;
    }
  }
}

absl::StatusOr<std::vector<Token>> Lexer::Run() {
  while (pos_ < src_.size()) {
    size_t tag = FindTagStart(pos_);
    if (tag == std::string::npos) {
      EmitText(std::string_view(src_).substr(pos_), pos_);
      break;
    }
    char kind = src_[tag + 1];
    size_t after = tag + 2;
    char ctrl = after < src_.size() && (src_[after] == '-' || src_[after] == '+') ? src_[after] : 0;
    size_t raw_end;
    char raw_begin_ctrl, raw_end_ctrl;
    bool raw = kind == '%' && MatchRaw(tag, "raw", &raw_end, &raw_begin_ctrl, &raw_end_ctrl);
    std::string_view text = std::string_view(src_).substr(pos_, tag - pos_);
    EmitText(LeftControl(text, ctrl, kind == '{'), pos_);
    if (raw) {
      if (auto s = LexRaw(tag, raw_end, raw_end_ctrl); !s.ok()) return s;
      continue;
    }
    size_t body = after + (ctrl ? 1 : 0);
    if (kind == '#') {
      if (auto s = LexComment(body); !s.ok()) return s;
      continue;
    }
    out_.push_back({kind == '%' ? TokenType::kBlockBegin : TokenType::kVarBegin, "", LineAt(tag)});
    pos_ = body;
    if (auto s = LexTag(kind == '%'); !s.ok()) return s;
  }
  out_.push_back({TokenType::kEof, "", LineAt(src_.size())});
  return std::move(out_);
}

}  // namespace

absl::StatusOr<std::vector<Token>> LexTemplate(std::string_view source, const std::string& name) {
  Lexer lexer(source, name);
  return lexer.Run();
}

}  // namespace tandem::chat
