#include "common/chat/py_format.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/chat/jinja_format.h"
#include "common/chat/py_strings.h"
#include "common/util/utf8.h"

namespace tandem::chat {
namespace {

struct Spec {
  std::string fill = " ";
  char align = 0;  // < > ^ =, or 0 for the type's default
  char sign = '-';
  bool alt = false;
  int width = -1;
  char grouping = 0;
  int precision = -1;
  char type = 0;
};

absl::Status FormatError(std::string msg) { return absl::InvalidArgumentError(std::move(msg)); }

std::string Group(const std::string& digits, char sep, size_t every) {
  std::string out;
  size_t n = digits.size();
  for (size_t i = 0; i < n; ++i) {
    if (i > 0 && (n - i) % every == 0) out.push_back(sep);
    out.push_back(digits[i]);
  }
  return out;
}

// Pads `prefix` (sign and 0x) + `body` to the spec's width.
std::string Pad(const std::string& prefix, const std::string& body, const Spec& s,
                char default_align) {
  size_t len = CodePointCount(prefix) + CodePointCount(body);
  if (s.width < 0 || len >= static_cast<size_t>(s.width)) return absl::StrCat(prefix, body);
  size_t pad = static_cast<size_t>(s.width) - len;
  auto fill = [&](size_t n) {
    std::string out;
    for (size_t i = 0; i < n; ++i) out += s.fill;
    return out;
  };
  switch (s.align ? s.align : default_align) {
    case '<':
      return absl::StrCat(prefix, body, fill(pad));
    case '^':
      return absl::StrCat(fill(pad / 2), prefix, body, fill(pad - pad / 2));
    case '=':
      return absl::StrCat(prefix, fill(pad), body);
    default:
      return absl::StrCat(fill(pad), prefix, body);
  }
}

std::string SignOf(bool negative, const Spec& s) {
  if (negative) return "-";
  return s.sign == '+' ? "+" : s.sign == ' ' ? " " : "";
}

std::string FormatFloat(double v, Spec s) {
  char type = s.type;
  bool general_default = type == 0;
  if (type == 0 && s.precision < 0) {
    std::string r = FloatRepr(std::fabs(v));
    return Pad(SignOf(std::signbit(v) && !std::isnan(v), s), r, s, '>');
  }
  if (type == 0 || type == 'n') type = 'g';
  int precision = s.precision < 0 ? 6 : s.precision;
  double a = std::fabs(v);
  std::string body;
  char buf[512];
  if (std::isinf(a) || std::isnan(a)) {
    body = std::isnan(a) ? "nan" : "inf";
    if (std::isupper(static_cast<unsigned char>(type))) body = body == "nan" ? "NAN" : "INF";
  } else if (type == '%') {
    std::snprintf(buf, sizeof(buf), s.alt ? "%#.*f" : "%.*f", precision, a * 100);
    body = absl::StrCat(buf, "%");
  } else {
    if (precision > 300) precision = 300;
    std::string f = absl::StrCat("%", s.alt ? "#" : "", ".*", std::string(1, type));
    std::snprintf(buf, sizeof(buf), f.c_str(), precision, a);
    body = buf;
    if (general_default && body.find_first_of(".eEn") == std::string::npos) body += ".0";
  }
  if (s.grouping && !body.empty() && std::isdigit(static_cast<unsigned char>(body[0]))) {
    size_t end = body.find_first_not_of("0123456789");
    if (end == std::string::npos) end = body.size();
    body = absl::StrCat(Group(body.substr(0, end), s.grouping, 3), body.substr(end));
  }
  return Pad(SignOf(std::signbit(v) && !std::isnan(v), s), body, s, '>');
}

absl::StatusOr<std::string> FormatInt(Int v, const Spec& s) {
  if (s.type && std::strchr("eEfFgG%", s.type) != nullptr) {
    return FormatFloat(static_cast<double>(v), s);
  }
  bool negative = v < 0;
  unsigned __int128 u =
      negative ? -static_cast<unsigned __int128>(v) : static_cast<unsigned __int128>(v);
  if (s.type == 'c') {
    std::string out;
    AppendUtf8(static_cast<char32_t>(u), &out);
    return Pad("", out, s, '<');
  }
  int base = s.type == 'x' || s.type == 'X' ? 16 : s.type == 'o' ? 8 : s.type == 'b' ? 2 : 10;
  if (base == 10 && s.type && s.type != 'd' && s.type != 'n') {
    return FormatError(absl::StrCat("Unknown format code '", std::string(1, s.type),
                                    "' for object of type 'int'"));
  }
  std::string digits;
  const char* kDigits = s.type == 'X' ? "0123456789ABCDEF" : "0123456789abcdef";
  do {
    digits.insert(digits.begin(), kDigits[static_cast<int>(u % base)]);
    u /= base;
  } while (u > 0);
  if (s.grouping) digits = Group(digits, s.grouping, base == 10 ? 3 : 4);
  std::string prefix = SignOf(negative, s);
  if (s.alt && base != 10)
    prefix += s.type == 'X' ? "0X" : s.type == 'x' ? "0x" : s.type == 'o' ? "0o" : "0b";
  return Pad(prefix, digits, s, '>');
}

absl::StatusOr<std::string> FormatString(const std::string& str, const Spec& s) {
  if (s.type && s.type != 's') {
    return FormatError(absl::StrCat("Unknown format code '", std::string(1, s.type),
                                    "' for object of type 'str'"));
  }
  std::string body = str;
  if (s.precision >= 0) {
    size_t begin, end;
    PyCodePointRange(body, 0, s.precision, &begin, &end);
    body = body.substr(0, end);
  }
  return Pad("", body, s, '<');
}

absl::StatusOr<std::string> ApplySpec(const Value& v, const Spec& s, RenderState& state) {
  if (v.is_int() || (v.is_bool() && s.type)) return FormatInt(v.int_value(), s);
  if (v.is_float()) return FormatFloat(v.float_value(), s);
  auto str = ToStr(v, state.format());
  if (!str.ok()) return str.status();
  return FormatString(*str, s);
}

absl::StatusOr<Spec> ParseSpec(const std::string& text) {
  Spec s;
  size_t i = 0;
  auto is_align = [](char c) { return c == '<' || c == '>' || c == '^' || c == '='; };
  size_t first_len = text.empty() ? 0 : Utf8LeadLength(static_cast<unsigned char>(text[0]));
  if (text.size() > first_len && is_align(text[first_len])) {
    s.fill = text.substr(0, first_len);
    s.align = text[first_len];
    i = first_len + 1;
  } else if (!text.empty() && is_align(text[0])) {
    s.align = text[0];
    i = 1;
  }
  if (i < text.size() && (text[i] == '+' || text[i] == '-' || text[i] == ' ')) s.sign = text[i++];
  if (i < text.size() && text[i] == '#') {
    s.alt = true;
    ++i;
  }
  if (i < text.size() && text[i] == '0') {
    if (!s.align) {
      s.fill.assign(1, '0');
      s.align = '=';
    }
    ++i;
  }
  auto number = [&]() {
    int n = 0;
    while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])) && n < 100000) {
      n = n * 10 + (text[i++] - '0');
    }
    return n;
  };
  if (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) s.width = number();
  if (i < text.size() && (text[i] == ',' || text[i] == '_')) s.grouping = text[i++];
  if (i < text.size() && text[i] == '.') {
    ++i;
    s.precision = number();
  }
  if (i < text.size()) s.type = text[i++];
  if (i != text.size()) return FormatError(absl::StrCat("Invalid format specifier '", text, "'"));
  return s;
}

struct PercentSpec {
  std::optional<std::string> key;  // %(key)s
  Spec spec;
  char conv = 's';
};

// The conversion after a '%' (fmt[*i] is its first character); leaves *i on the conversion.
absl::StatusOr<PercentSpec> ParsePercent(const std::string& fmt, size_t* i) {
  PercentSpec out;
  size_t& p = *i;
  if (fmt[p] == '(') {
    size_t close = fmt.find(')', p);
    if (close == std::string::npos) return FormatError("incomplete format key");
    out.key = fmt.substr(p + 1, close - p - 1);
    p = close + 1;
  }
  bool left = false, zero = false;
  for (; p < fmt.size() && std::strchr("-+ #0", fmt[p]) != nullptr; ++p) {
    if (fmt[p] == '-') left = true;
    if (fmt[p] == '0') zero = true;
    if (fmt[p] == '+' || (fmt[p] == ' ' && out.spec.sign != '+')) out.spec.sign = fmt[p];
    if (fmt[p] == '#') out.spec.alt = true;
  }
  auto number = [&]() {
    int n = 0;
    while (p < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[p])) && n < 100000) {
      n = n * 10 + (fmt[p++] - '0');
    }
    return n;
  };
  if (p < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[p]))) out.spec.width = number();
  if (p < fmt.size() && fmt[p] == '.') {
    ++p;
    out.spec.precision = number();
  }
  while (p < fmt.size() && std::strchr("hlL", fmt[p]) != nullptr) ++p;
  if (p >= fmt.size()) return FormatError("incomplete format");
  out.conv = fmt[p];
  out.spec.align = left ? '<' : '>';
  if (zero && !left && std::strchr("sra", out.conv) == nullptr) {
    out.spec.fill.assign(1, '0');
    out.spec.align = '=';
  }
  return out;
}

absl::StatusOr<std::string> FormatPercent(const PercentSpec& ps, const Value& value,
                                          RenderState& state) {
  Spec s = ps.spec;
  char conv = ps.conv;
  if (conv == 's' || conv == 'r' || conv == 'a') {
    std::string text;
    absl::Status st = conv == 's' ? AppendStr(value, state.format(), &text)
                                  : AppendRepr(value, state.format(), &text);
    if (!st.ok()) return st;
    return FormatString(text, s);
  }
  if (std::strchr("diuxXoc", conv) != nullptr) {
    bool integer_only = conv != 'd' && conv != 'i' && conv != 'u';
    if (!value.is_number() || (integer_only && value.is_float() && conv != 'c')) {
      return FormatError(absl::StrCat("%", std::string(1, conv),
                                      " format: ", integer_only ? "an integer" : "a real number",
                                      " is required, not ", TypeName(value)));
    }
    s.type = conv == 'i' || conv == 'u' ? 'd' : conv;
    double f = value.float_value();
    if (value.is_float() && (!std::isfinite(f) || std::fabs(f) > 1e38)) {
      return FormatError("cannot convert float to integer");
    }
    return FormatInt(value.is_float() ? static_cast<Int>(std::trunc(f)) : value.int_value(), s);
  }
  if (std::strchr("eEfFgG", conv) != nullptr) {
    if (!value.is_number()) {
      return FormatError(absl::StrCat("must be real number, not ", TypeName(value)));
    }
    s.type = conv;
    return FormatFloat(value.float_value(), s);
  }
  return FormatError(absl::StrCat("unsupported format character '", std::string(1, conv), "'"));
}

// One {field!conv:spec} of str.format, without the braces.
absl::StatusOr<std::string> FormatField(std::string field, const CallArgs& args, size_t* auto_index,
                                        RenderState& state) {
  std::string spec_text, conv;
  if (size_t colon = field.find(':'); colon != std::string::npos) {
    spec_text = field.substr(colon + 1);
    field = field.substr(0, colon);
  }
  if (size_t bang = field.find('!'); bang != std::string::npos) {
    conv = field.substr(bang + 1);
    field = field.substr(0, bang);
  }
  Value value;
  if (field.empty() || std::isdigit(static_cast<unsigned char>(field[0]))) {
    size_t index = field.empty() ? (*auto_index)++ : std::strtoul(field.c_str(), nullptr, 10);
    if (index >= args.positional.size()) {
      return FormatError(absl::StrCat("Replacement index ", index, " out of range"));
    }
    value = args.positional[index];
  } else {
    auto it = std::find_if(args.keyword.begin(), args.keyword.end(),
                           [&](const auto& kv) { return kv.first == field; });
    if (it == args.keyword.end()) return FormatError(absl::StrCat("KeyError: '", field, "'"));
    value = it->second;
  }
  if (conv == "r" || conv == "a") {
    std::string text;
    if (auto s = AppendRepr(value, state.format(), &text); !s.ok()) return s;
    value = Value::String(std::move(text));
  } else if (!conv.empty() && conv != "s") {
    return FormatError(absl::StrCat("Unknown conversion specifier ", conv));
  }
  auto spec = ParseSpec(spec_text);
  if (!spec.ok()) return spec.status();
  return ApplySpec(value, *spec, state);
}

}  // namespace

absl::StatusOr<std::string> PercentFormat(const std::string& fmt, const Value& args,
                                          RenderState& state) {
  std::vector<Value> list;
  const Dict* mapping = args.is_dict() ? args.dict() : nullptr;
  if (args.kind() == ValueKind::kTuple) {
    list = args.list()->items;
  } else {
    list.push_back(args);
  }
  size_t next = 0;
  std::string out;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out.push_back(fmt[i]);
      continue;
    }
    if (++i >= fmt.size()) return FormatError("incomplete format");
    if (fmt[i] == '%') {
      out.push_back('%');
      continue;
    }
    auto spec = ParsePercent(fmt, &i);
    if (!spec.ok()) return spec.status();
    Value value;
    if (spec->key) {
      if (mapping == nullptr) return FormatError("format requires a mapping");
      const Value* found = mapping->FindString(*spec->key);
      if (found == nullptr) return FormatError(absl::StrCat("KeyError: '", *spec->key, "'"));
      value = *found;
    } else {
      if (next >= list.size()) return FormatError("not enough arguments for format string");
      value = list[next++];
    }
    auto piece = FormatPercent(*spec, value, state);
    if (!piece.ok()) return piece.status();
    out += *piece;
    if (out.size() > state.heap().max_string_bytes()) {
      return absl::ResourceExhaustedError("formatted string too long");
    }
  }
  if (mapping == nullptr && next < list.size()) {
    return FormatError("not all arguments converted during string formatting");
  }
  return out;
}

absl::StatusOr<std::string> BraceFormat(const std::string& fmt, const CallArgs& args,
                                        RenderState& state) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    char c = fmt[i];
    bool doubled = i + 1 < fmt.size() && fmt[i + 1] == c;
    if ((c == '{' || c == '}') && doubled) {
      out.push_back(c);
      ++i;
      continue;
    }
    if (c == '}') return FormatError("Single '}' encountered in format string");
    if (c != '{') {
      out.push_back(c);
      continue;
    }
    size_t close = fmt.find('}', i);
    if (close == std::string::npos) return FormatError("Single '{' encountered in format string");
    auto piece = FormatField(fmt.substr(i + 1, close - i - 1), args, &auto_index, state);
    if (!piece.ok()) return piece.status();
    out += *piece;
    i = close;
    if (out.size() > state.heap().max_string_bytes()) {
      return absl::ResourceExhaustedError("formatted string too long");
    }
  }
  return out;
}

}  // namespace tandem::chat
