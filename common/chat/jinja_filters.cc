// Jinja's built-in filters on strings and numbers, and the table of every filter (sequence
// filters are in jinja_seq_filters.cc). `tojson` is transformers' version: json.dumps with
// ensure_ascii=False and insertion order, not Jinja's HTML-safe one.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "common/chat/jinja_access.h"
#include "common/chat/jinja_builtins.h"
#include "common/chat/jinja_format.h"
#include "common/chat/jinja_ops.h"
#include "common/chat/jinja_seq_filters.h"
#include "common/chat/py_format.h"
#include "common/chat/py_strings.h"
#include "common/chat/render_state.h"

namespace tandem::chat {
namespace {

using Result = absl::StatusOr<Value>;

absl::StatusOr<std::vector<std::optional<Value>>> Bind(std::string_view fn, const CallArgs& args,
                                                       std::vector<std::string_view> names,
                                                       size_t required = 0) {
  return BindArgs(fn, args, names, required);
}

// A filter that maps str(value) through `fn`.
template <std::string (*kFn)(std::string_view)>
Result StrFilter(const Value& v, const CallArgs& args, RenderState& state) {
  auto a = Bind("filter", args, {});
  if (!a.ok()) return a.status();
  auto s = ToStr(v, state.format());
  if (!s.ok()) return s.status();
  return state.heap().NewString(kFn(*s));
}

Result Trim(const Value& v, const CallArgs& args, RenderState& state) {
  auto a = Bind("trim", args, {"chars"});
  if (!a.ok()) return a.status();
  auto s = ToStr(v, state.format());
  if (!s.ok()) return s.status();
  std::optional<std::string> chars;
  if ((*a)[0] && !(*a)[0]->is_none()) {
    auto c = ToStr(*(*a)[0], state.format());
    if (!c.ok()) return c.status();
    chars = *c;
  }
  return state.heap().NewString(PyStrip(*s, chars, true, true));
}

Result Default(const Value& v, const CallArgs& args, RenderState&) {
  auto a = Bind("default", args, {"default_value", "boolean"});
  if (!a.ok()) return a.status();
  bool boolean = (*a)[1] && Truthy(*(*a)[1]);
  if (v.is_undefined() || (boolean && !Truthy(v))) {
    return (*a)[0] ? *(*a)[0] : Value::String("");
  }
  return v;
}

Result Escape(const Value& v, const CallArgs& args, RenderState& state) {
  auto s = ToStr(v, state.format());
  if (!s.ok()) return s.status();
  std::string out;
  for (char c : *s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out.push_back(c);
    }
  }
  return state.heap().NewString(std::move(out));
}

Result ToString(const Value& v, const CallArgs&, RenderState& state) {
  if (v.is_string()) return v;
  auto s = ToStr(v, state.format());
  if (!s.ok()) return s.status();
  return state.heap().NewString(std::move(*s));
}

// Python's float(str): whitespace, sign, digits with single underscores, inf, nan.
std::optional<double> ParseFloat(const std::string& text) {
  std::string s = PyStrip(text, std::nullopt, true, true);
  std::string clean;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '_') {
      if (i == 0 || i + 1 == s.size() || !std::isdigit(static_cast<unsigned char>(s[i - 1])) ||
          !std::isdigit(static_cast<unsigned char>(s[i + 1]))) {
        return std::nullopt;
      }
      continue;
    }
    clean.push_back(s[i]);
  }
  if (clean.empty() || clean.find_first_of("xXpP") != std::string::npos) return std::nullopt;
  char* end = nullptr;
  double d = std::strtod(clean.c_str(), &end);
  if (end != clean.c_str() + clean.size()) return std::nullopt;
  return d;
}

// Python's int(str, base) for base 10 (and prefixed 0x/0o/0b with base 0 or matching).
std::optional<Int> ParseInt(const std::string& text, int base) {
  std::string s = PyStrip(text, std::nullopt, true, true);
  size_t i = 0;
  bool negative = false;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) negative = s[i++] == '-';
  if (i + 1 < s.size() && s[i] == '0') {
    char p = static_cast<char>(std::tolower(static_cast<unsigned char>(s[i + 1])));
    int prefixed = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
    if (prefixed && (base == 0 || base == prefixed)) {
      base = prefixed;
      i += 2;
      if (i < s.size() && s[i] == '_') ++i;
    }
  }
  if (base == 0) base = 10;
  if (i >= s.size() || base < 2 || base > 36) return std::nullopt;
  Int v = 0;
  for (; i < s.size(); ++i) {
    char c = static_cast<char>(std::tolower(static_cast<unsigned char>(s[i])));
    if (c == '_' && i + 1 < s.size() && s[i + 1] != '_') continue;
    int d = std::isdigit(static_cast<unsigned char>(c)) ? c - '0'
            : (c >= 'a' && c <= 'z')                    ? c - 'a' + 10
                                                        : 99;
    if (d >= base) return std::nullopt;
    if (__builtin_mul_overflow(v, static_cast<Int>(base), &v) ||
        __builtin_add_overflow(v, static_cast<Int>(d), &v)) {
      return std::nullopt;
    }
  }
  return negative ? -v : v;
}

std::optional<double> AsFloat(const Value& v) {
  if (v.is_number()) return v.float_value();
  if (v.is_string()) return ParseFloat(v.str());
  return std::nullopt;
}

Result Float(const Value& v, const CallArgs& args, RenderState&) {
  auto a = Bind("float", args, {"default"});
  if (!a.ok()) return a.status();
  if (auto f = AsFloat(v)) return Value::Float(*f);
  return (*a)[0] ? *(*a)[0] : Value::Float(0.0);
}

Result IntFilter(const Value& v, const CallArgs& args, RenderState&) {
  auto a = Bind("int", args, {"default", "base"});
  if (!a.ok()) return a.status();
  int base = 10;
  if ((*a)[1] && (*a)[1]->is_integral()) base = static_cast<int>((*a)[1]->int_value());
  if (v.is_integral()) return Value::Integer(v.int_value());
  if (v.is_string()) {
    if (auto i = ParseInt(v.str(), base)) return Value::Integer(*i);
  }
  if (auto f = AsFloat(v); f && std::isfinite(*f) && std::fabs(*f) < 1e38) {
    return Value::Integer(static_cast<Int>(std::trunc(*f)));
  }
  return (*a)[0] ? *(*a)[0] : Value::Integer(0);
}

Result Abs(const Value& v, const CallArgs& args, RenderState&) {
  if (v.is_float()) return Value::Float(std::fabs(v.float_value()));
  if (!v.is_integral()) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad operand type for abs(): '", TypeName(v), "'"));
  }
  return UnaryOperation(v, v.int_value() < 0);
}

Result Round(const Value& v, const CallArgs& args, RenderState&) {
  auto a = Bind("round", args, {"precision", "method"});
  if (!a.ok()) return a.status();
  Int precision = (*a)[0] && (*a)[0]->is_integral() ? (*a)[0]->int_value() : 0;
  precision = std::max<Int>(-300, std::min<Int>(300, precision));
  std::string method = (*a)[1] && (*a)[1]->is_string() ? (*a)[1]->str() : "common";
  if (method != "common" && method != "ceil" && method != "floor") {
    return absl::InvalidArgumentError("method must be common, ceil or floor");
  }
  if (!v.is_number()) {
    return absl::InvalidArgumentError(
        absl::StrCat("type ", TypeName(v), " doesn't define __round__ method"));
  }
  double x = v.float_value();
  double scale = std::pow(10.0, static_cast<double>(precision));
  if (method != "common") {
    double r = method == "ceil" ? std::ceil(x * scale) : std::floor(x * scale);
    return Value::Float(r / scale);
  }
  if (v.is_integral() && precision >= 0) return Value::Integer(v.int_value());
  if (precision >= 0) {
    char buf[512];
    std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(precision), x);
    return Value::Float(std::strtod(buf, nullptr));
  }
  double r = std::nearbyint(x / (1.0 / scale)) * (1.0 / scale);
  if (v.is_integral()) return Value::Integer(static_cast<Int>(r));
  return Value::Float(r);
}

Result Replace(const Value& v, const CallArgs& args, RenderState& state) {
  auto a = Bind("replace", args, {"old", "new", "count"}, 2);
  if (!a.ok()) return a.status();
  auto s = ToStr(v, state.format());
  auto from = ToStr(*(*a)[0], state.format());
  auto to = ToStr(*(*a)[1], state.format());
  if (!s.ok() || !from.ok() || !to.ok()) return absl::InvalidArgumentError("replace: bad value");
  int64_t count = -1;
  if ((*a)[2] && (*a)[2]->is_integral()) count = static_cast<int64_t>((*a)[2]->int_value());
  if (to->size() > from->size() &&
      PyCount(*s, *from) * (to->size() - from->size()) > state.heap().max_string_bytes()) {
    return absl::ResourceExhaustedError("string too long");
  }
  return state.heap().NewString(PyReplace(*s, *from, *to, count));
}

Result Indent(const Value& v, const CallArgs& args, RenderState& state) {
  auto a = Bind("indent", args, {"width", "first", "blank"});
  if (!a.ok()) return a.status();
  std::string pad = "    ";
  if ((*a)[0]) {
    if ((*a)[0]->is_string()) {
      pad = (*a)[0]->str();
    } else if ((*a)[0]->is_integral()) {
      Int w = std::max<Int>(0, std::min<Int>((*a)[0]->int_value(), 1 << 16));
      pad = std::string(static_cast<size_t>(w), ' ');
    }
  }
  bool first = (*a)[1] && Truthy(*(*a)[1]);
  bool blank = (*a)[2] && Truthy(*(*a)[2]);
  auto text = ToStr(v, state.format());
  if (!text.ok()) return text.status();
  std::vector<std::string> lines = PySplitLines(*text + "\n", false);
  if (lines.size() * pad.size() > state.heap().max_string_bytes()) {
    return absl::ResourceExhaustedError("indented string too long");
  }
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) {
      out += "\n";
      if (blank || !lines[i].empty()) out += pad;
    }
    out += lines[i];
  }
  if (first) out = pad + out;
  return state.heap().NewString(std::move(out));
}

Result Format(const Value& v, const CallArgs& args, RenderState& state) {
  if (!args.positional.empty() && !args.keyword.empty()) {
    return absl::InvalidArgumentError("format: can't handle positional and keyword arguments");
  }
  auto fmt = ToStr(v, state.format());
  if (!fmt.ok()) return fmt.status();
  absl::StatusOr<Value> packed;
  if (!args.keyword.empty()) {
    auto dict = state.heap().NewDict();
    if (!dict.ok()) return dict.status();
    for (const auto& [k, val] : args.keyword) (*dict)->SetString(k, val);
    packed = Value::DictOf(*dict);
  } else {
    packed = state.heap().NewSequence(args.positional, /*tuple=*/true);
  }
  if (!packed.ok()) return packed.status();
  auto out = PercentFormat(*fmt, *packed, state);
  if (!out.ok()) return out.status();
  return state.heap().NewString(std::move(*out));
}

Result ToJson(const Value& v, const CallArgs& args, RenderState& state) {
  // transformers' signature: tojson(x, ensure_ascii=False, indent=None, separators=None,
  // sort_keys=False).
  auto a = Bind("tojson", args, {"ensure_ascii", "indent", "separators", "sort_keys"});
  if (!a.ok()) return a.status();
  JsonOptions o;
  const auto& indent = (*a)[1];
  if (indent && !indent->is_none()) {
    o.indent = true;
    o.item_separator = ",";
    if (indent->is_string()) {
      o.indent_str = indent->str();
    } else if (indent->is_integral()) {
      Int w = std::max<Int>(0, std::min<Int>(indent->int_value(), 1 << 10));
      o.indent_str = std::string(static_cast<size_t>(w), ' ');
    }
  }
  o.ensure_ascii = (*a)[0] && Truthy(*(*a)[0]);
  if (const auto& seps = (*a)[2]; seps && !seps->is_none()) {
    if (!seps->is_sequence() || seps->list()->items.size() != 2 ||
        !seps->list()->items[0].is_string() || !seps->list()->items[1].is_string()) {
      return absl::InvalidArgumentError("tojson: separators must be a pair of strings");
    }
    o.item_separator = seps->list()->items[0].str();
    o.key_separator = seps->list()->items[1].str();
  }
  o.sort_keys = (*a)[3] && Truthy(*(*a)[3]);
  std::string out;
  if (auto s = AppendJson(v, o, state.format(), &out); !s.ok()) return s;
  return state.heap().NewString(std::move(out));
}

Result WordCount(const Value& v, const CallArgs&, RenderState& state) {
  auto s = ToStr(v, state.format());
  if (!s.ok()) return s.status();
  Int words = 0;
  bool in_word = false;
  for (size_t pos = 0; pos < s->size();) {
    bool word = IsPyWordChar(NextCodePoint(*s, &pos));
    if (word && !in_word) ++words;
    in_word = word;
  }
  return Value::Integer(words);
}

Result Attr(const Value& v, const CallArgs& args, RenderState& state) {
  auto a = Bind("attr", args, {"name"}, 1);
  if (!a.ok()) return a.status();
  if (!(*a)[0]->is_string()) return Value();
  if (v.is_dict() && !HasMethod(v, (*a)[0]->str())) return Value();
  return GetAttr(v, (*a)[0]->str(), state);
}

Result Center(const Value& v, const CallArgs& args, RenderState& state) {
  auto a = Bind("center", args, {"width"});
  if (!a.ok()) return a.status();
  auto s = ToStr(v, state.format());
  if (!s.ok()) return s.status();
  CallArgs method_args;
  method_args.positional.push_back((*a)[0] ? *(*a)[0] : Value::Integer(80));
  return CallMethod(Value::String(*s), "center", method_args, state);
}

struct FilterEntry {
  std::string_view name;
  FilterFn fn;
};

constexpr FilterEntry kFilters[] = {
    {"abs", Abs},
    {"attr", Attr},
    {"batch", FilterBatch},
    {"capitalize", StrFilter<PyCapitalize>},
    {"center", Center},
    {"count", FilterLength},
    {"d", Default},
    {"default", Default},
    {"dictsort", FilterDictSort},
    {"e", Escape},
    {"escape", Escape},
    {"first", FilterFirst},
    {"float", Float},
    {"format", Format},
    {"indent", Indent},
    {"int", IntFilter},
    {"items", FilterItems},
    {"join", FilterJoin},
    {"last", FilterLast},
    {"length", FilterLength},
    {"list", FilterList},
    {"lower", StrFilter<PyLower>},
    {"map", FilterMap},
    {"max", FilterMax},
    {"min", FilterMin},
    {"reject", FilterReject},
    {"rejectattr", FilterRejectAttr},
    {"replace", Replace},
    {"reverse", FilterReverse},
    {"round", Round},
    {"safe", ToString},
    {"select", FilterSelect},
    {"selectattr", FilterSelectAttr},
    {"sort", FilterSort},
    {"string", ToString},
    {"sum", FilterSum},
    {"title", StrFilter<JinjaTitle>},
    {"tojson", ToJson},
    {"trim", Trim},
    {"unique", FilterUnique},
    {"upper", StrFilter<PyUpper>},
    {"wordcount", WordCount},
};

}  // namespace

FilterFn FindFilter(std::string_view name) {
  for (const FilterEntry& f : kFilters) {
    if (f.name == name) return f.fn;
  }
  return nullptr;
}

}  // namespace tandem::chat
