#include "common/chat/jinja_format.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "common/chat/jinja_heap.h"
#include "common/chat/py_strings.h"

namespace tandem::chat {
namespace {

absl::Status TooDeep() { return absl::ResourceExhaustedError("value nested too deeply to format"); }

absl::Status TooLong(const FormatLimits& limits) {
  return absl::ResourceExhaustedError(
      absl::StrCat("formatted value longer than ", limits.max_bytes, " bytes"));
}

void AppendHex(uint32_t v, int digits, std::string* out) {
  static const char kHex[] = "0123456789abcdef";
  for (int i = digits - 1; i >= 0; --i) out->push_back(kHex[(v >> (4 * i)) & 0xF]);
}

std::string CallableRepr(const Callable& fn) {
  switch (fn.type) {
    case Callable::Type::kMacro:
    case Callable::Type::kCaller:
      return absl::StrCat("<Macro '", fn.name, "'>");
    case Callable::Type::kMethod:
      return absl::StrCat("<built-in method ", fn.name, " of ", TypeName(fn.receiver), " object>");
    case Callable::Type::kGlobal:
      break;
  }
  return absl::StrCat("<function ", fn.name, ">");
}

absl::Status AppendReprAt(const Value& v, const FormatLimits& limits, int depth, std::string* out);

absl::Status AppendDictRepr(const Dict& d, const FormatLimits& limits, int depth,
                            std::string* out) {
  out->push_back('{');
  bool first = true;
  for (const auto& [k, val] : d.entries()) {
    if (!first) out->append(", ");
    first = false;
    if (auto s = AppendReprAt(k, limits, depth + 1, out); !s.ok()) return s;
    out->append(": ");
    if (auto s = AppendReprAt(val, limits, depth + 1, out); !s.ok()) return s;
  }
  out->push_back('}');
  return absl::OkStatus();
}

absl::Status AppendReprAt(const Value& v, const FormatLimits& limits, int depth, std::string* out) {
  if (depth > limits.max_depth) return TooDeep();
  if (out->size() > limits.max_bytes) return TooLong(limits);
  switch (v.kind()) {
    case ValueKind::kUndefined:
      out->append("Undefined");
      return absl::OkStatus();
    case ValueKind::kString:
      AppendStringRepr(v.str(), out);
      return absl::OkStatus();
    case ValueKind::kList:
    case ValueKind::kTuple: {
      const auto& items = v.list()->items;
      bool tuple = v.kind() == ValueKind::kTuple;
      out->push_back(tuple ? '(' : '[');
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out->append(", ");
        if (auto s = AppendReprAt(items[i], limits, depth + 1, out); !s.ok()) return s;
      }
      if (tuple && items.size() == 1) out->push_back(',');
      out->push_back(tuple ? ')' : ']');
      return absl::OkStatus();
    }
    case ValueKind::kDict:
      return AppendDictRepr(*v.dict(), limits, depth, out);
    case ValueKind::kNamespace: {
      out->append("<Namespace ");
      if (auto s = AppendDictRepr(*v.dict(), limits, depth, out); !s.ok()) return s;
      out->push_back('>');
      return absl::OkStatus();
    }
    default:
      return AppendStr(v, limits, out);
  }
}

absl::Status AppendJsonString(const std::string& s, bool ensure_ascii, std::string* out) {
  out->push_back('"');
  for (size_t pos = 0; pos < s.size();) {
    size_t begin = pos;
    char32_t c = NextCodePoint(s, &pos);
    switch (c) {
      case '"':
        out->append("\\\"");
        continue;
      case '\\':
        out->append("\\\\");
        continue;
      case '\n':
        out->append("\\n");
        continue;
      case '\r':
        out->append("\\r");
        continue;
      case '\t':
        out->append("\\t");
        continue;
      case '\b':
        out->append("\\b");
        continue;
      case '\f':
        out->append("\\f");
        continue;
      default:
        break;
    }
    if (c < 0x20 || (ensure_ascii && c >= 0x80)) {
      if (c > 0xFFFF) {
        char32_t v = c - 0x10000;
        out->append("\\u");
        AppendHex(0xD800 + (v >> 10), 4, out);
        out->append("\\u");
        AppendHex(0xDC00 + (v & 0x3FF), 4, out);
      } else {
        out->append("\\u");
        AppendHex(c, 4, out);
      }
      continue;
    }
    out->append(s, begin, pos - begin);
  }
  out->push_back('"');
  return absl::OkStatus();
}

absl::StatusOr<std::string> JsonKey(const Value& k) {
  switch (k.kind()) {
    case ValueKind::kString:
      return k.str();
    case ValueKind::kNone:
      return std::string("null");
    case ValueKind::kBool:
      return std::string(k.bool_value() ? "true" : "false");
    case ValueKind::kInt:
      return IntToString(k.int_value());
    case ValueKind::kFloat:
      return FloatRepr(k.float_value());
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("tojson: keys must be str, int, float, bool or None, not ", TypeName(k)));
  }
}

absl::Status AppendJsonAt(const Value& v, const JsonOptions& o, const FormatLimits& limits,
                          int depth, std::string* out);

void NewlineIndent(const JsonOptions& o, int level, std::string* out) {
  out->push_back('\n');
  for (int i = 0; i < level; ++i) out->append(o.indent_str);
}

absl::Status AppendJsonObject(const Dict& d, const JsonOptions& o, const FormatLimits& limits,
                              int depth, std::string* out) {
  if (d.size() == 0) {
    out->append("{}");
    return absl::OkStatus();
  }
  std::vector<std::pair<std::string, const Value*>> items;
  for (const auto& [k, val] : d.entries()) {
    auto key = JsonKey(k);
    if (!key.ok()) return key.status();
    items.emplace_back(std::move(*key), &val);
  }
  if (o.sort_keys) {
    std::stable_sort(items.begin(), items.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
  }
  out->push_back('{');
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out->append(o.item_separator);
    if (o.indent) NewlineIndent(o, depth + 1, out);
    if (auto s = AppendJsonString(items[i].first, o.ensure_ascii, out); !s.ok()) return s;
    out->append(o.key_separator);
    if (auto s = AppendJsonAt(*items[i].second, o, limits, depth + 1, out); !s.ok()) return s;
  }
  if (o.indent) NewlineIndent(o, depth, out);
  out->push_back('}');
  return absl::OkStatus();
}

absl::Status AppendJsonAt(const Value& v, const JsonOptions& o, const FormatLimits& limits,
                          int depth, std::string* out) {
  if (depth > limits.max_depth) return TooDeep();
  if (out->size() > limits.max_bytes) return TooLong(limits);
  switch (v.kind()) {
    case ValueKind::kNone:
      out->append("null");
      return absl::OkStatus();
    case ValueKind::kBool:
      out->append(v.bool_value() ? "true" : "false");
      return absl::OkStatus();
    case ValueKind::kInt:
      out->append(IntToString(v.int_value()));
      return absl::OkStatus();
    case ValueKind::kFloat: {
      double f = v.float_value();
      if (std::isnan(f)) {
        out->append("NaN");
      } else if (std::isinf(f)) {
        out->append(f > 0 ? "Infinity" : "-Infinity");
      } else {
        out->append(FloatRepr(f));
      }
      return absl::OkStatus();
    }
    case ValueKind::kString:
      return AppendJsonString(v.str(), o.ensure_ascii, out);
    case ValueKind::kList:
    case ValueKind::kTuple: {
      const auto& items = v.list()->items;
      if (items.empty()) {
        out->append("[]");
        return absl::OkStatus();
      }
      out->push_back('[');
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out->append(o.item_separator);
        if (o.indent) NewlineIndent(o, depth + 1, out);
        if (auto s = AppendJsonAt(items[i], o, limits, depth + 1, out); !s.ok()) return s;
      }
      if (o.indent) NewlineIndent(o, depth, out);
      out->push_back(']');
      return absl::OkStatus();
    }
    case ValueKind::kDict:
      return AppendJsonObject(*v.dict(), o, limits, depth, out);
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("tojson: Object of type ", TypeName(v), " is not JSON serializable"));
  }
}

}  // namespace

std::string IntToString(Int i) {
  if (i == 0) return "0";
  bool negative = i < 0;
  unsigned __int128 u =
      negative ? -static_cast<unsigned __int128>(i) : static_cast<unsigned __int128>(i);
  std::string digits;
  while (u > 0) {
    digits.push_back(static_cast<char>('0' + static_cast<int>(u % 10)));
    u /= 10;
  }
  if (negative) digits.push_back('-');
  std::reverse(digits.begin(), digits.end());
  return digits;
}

std::string FloatRepr(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), f, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  // sci is "-d.ddde+XX": split into sign, digits and exponent.
  std::string sign;
  size_t p = 0;
  if (sci[0] == '-') {
    sign = "-";
    p = 1;
  }
  size_t e_pos = sci.find('e');
  std::string digits;
  for (size_t i = p; i < e_pos; ++i) {
    if (sci[i] != '.') digits.push_back(sci[i]);
  }
  int exp = std::atoi(sci.c_str() + e_pos + 1);
  if (exp < -4 || exp >= 16) {
    char e[16];
    std::snprintf(e, sizeof(e), "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    if (digits.size() == 1) return absl::StrCat(sign, digits, e);
    return absl::StrCat(sign, digits.substr(0, 1), ".", digits.substr(1), e);
  }
  if (exp < 0) {
    return absl::StrCat(sign, "0.", std::string(static_cast<size_t>(-exp - 1), '0'), digits);
  }
  size_t point = static_cast<size_t>(exp) + 1;
  if (point >= digits.size()) {
    return absl::StrCat(sign, digits, std::string(point - digits.size(), '0'), ".0");
  }
  return absl::StrCat(sign, digits.substr(0, point), ".", digits.substr(point));
}

void AppendStringRepr(const std::string& s, std::string* out) {
  bool has_single = s.find('\'') != std::string::npos;
  bool has_double = s.find('"') != std::string::npos;
  char quote = has_single && !has_double ? '"' : '\'';
  out->push_back(quote);
  for (size_t pos = 0; pos < s.size();) {
    size_t begin = pos;
    char32_t c = NextCodePoint(s, &pos);
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out->push_back('\\');
      out->push_back(static_cast<char>(c));
    } else if (c == '\n') {
      out->append("\\n");
    } else if (c == '\r') {
      out->append("\\r");
    } else if (c == '\t') {
      out->append("\\t");
    } else if (IsPyPrintable(c)) {
      out->append(s, begin, pos - begin);
    } else if (c < 0x100) {
      out->append("\\x");
      AppendHex(c, 2, out);
    } else if (c < 0x10000) {
      out->append("\\u");
      AppendHex(c, 4, out);
    } else {
      out->append("\\U");
      AppendHex(c, 8, out);
    }
  }
  out->push_back(quote);
}

absl::Status AppendStr(const Value& v, const FormatLimits& limits, std::string* out) {
  switch (v.kind()) {
    case ValueKind::kUndefined:
      return absl::OkStatus();
    case ValueKind::kNone:
      out->append("None");
      return absl::OkStatus();
    case ValueKind::kBool:
      out->append(v.bool_value() ? "True" : "False");
      return absl::OkStatus();
    case ValueKind::kInt:
      out->append(IntToString(v.int_value()));
      return absl::OkStatus();
    case ValueKind::kFloat:
      out->append(FloatRepr(v.float_value()));
      return absl::OkStatus();
    case ValueKind::kString:
      out->append(v.str());
      return absl::OkStatus();
    case ValueKind::kLoop:
      absl::StrAppend(out, "<LoopContext ", v.loop()->index0 + 1, "/", v.loop()->items.size(), ">");
      return absl::OkStatus();
    case ValueKind::kCallable:
      out->append(CallableRepr(*v.callable()));
      return absl::OkStatus();
    default:
      return AppendReprAt(v, limits, 0, out);
  }
}

absl::StatusOr<std::string> ToStr(const Value& v, const FormatLimits& limits) {
  if (v.is_string()) return v.str();
  std::string out;
  if (auto s = AppendStr(v, limits, &out); !s.ok()) return s;
  if (out.size() > limits.max_bytes) return TooLong(limits);
  return out;
}

absl::Status AppendRepr(const Value& v, const FormatLimits& limits, std::string* out) {
  return AppendReprAt(v, limits, 0, out);
}

absl::Status AppendJson(const Value& v, const JsonOptions& options, const FormatLimits& limits,
                        std::string* out) {
  size_t start = out->size();
  if (auto s = AppendJsonAt(v, options, limits, 0, out); !s.ok()) return s;
  if (out->size() - start > limits.max_bytes) return TooLong(limits);
  return absl::OkStatus();
}

}  // namespace tandem::chat
