// Python methods templates call on values: str (strip, split, startswith, format, ...), list
// (append, pop, index, ...), dict (get, items, keys, values, ...) and loop (cycle, changed).
#include <algorithm>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "common/chat/jinja_access.h"
#include "common/chat/jinja_builtins.h"
#include "common/chat/jinja_container_methods.h"
#include "common/chat/jinja_format.h"
#include "common/chat/jinja_ops.h"
#include "common/chat/py_format.h"
#include "common/chat/py_strings.h"
#include "common/chat/render_state.h"

namespace tandem::chat {
namespace {

using Args = std::vector<std::optional<Value>>;

constexpr std::string_view kStrMethods[] = {
    "strip",      "lstrip",     "rstrip",  "split",   "rsplit",       "splitlines",
    "startswith", "endswith",   "upper",   "lower",   "title",        "capitalize",
    "swapcase",   "casefold",   "replace", "find",    "rfind",        "index",
    "rindex",     "count",      "format",  "join",    "isdigit",      "isalpha",
    "isalnum",    "isspace",    "islower", "isupper", "removeprefix", "removesuffix",
    "partition",  "rpartition", "center",  "ljust",   "rjust",        "zfill"};
constexpr std::string_view kListMethods[] = {"append", "pop",   "insert", "extend", "remove",
                                             "index",  "count", "copy",   "clear",  "reverse"};
constexpr std::string_view kDictMethods[] = {"get",  "items", "keys",   "values",
                                             "copy", "pop",   "update", "setdefault"};

template <size_t N>
bool In(std::string_view name, const std::string_view (&list)[N]) {
  return std::find(std::begin(list), std::end(list), name) != std::end(list);
}

absl::Status ArgTypeError(std::string_view method, std::string_view want, const Value& got) {
  return absl::InvalidArgumentError(absl::StrCat(std::string(method), "() argument must be ",
                                                 std::string(want), ", not ", TypeName(got)));
}

absl::StatusOr<std::optional<std::string>> OptionalStr(std::string_view method,
                                                       const std::optional<Value>& v) {
  if (!v || v->is_none()) return std::nullopt;
  if (!v->is_string()) return ArgTypeError(method, "str or None", *v);
  return v->str();
}

absl::StatusOr<int64_t> OptionalInt(std::string_view method, const std::optional<Value>& v,
                                    int64_t fallback) {
  if (!v || v->is_none()) return fallback;
  if (!v->is_integral()) return ArgTypeError(method, "int", *v);
  Int i = v->int_value();
  return static_cast<int64_t>(std::clamp<Int>(i, INT64_MIN / 2, INT64_MAX / 2));
}

absl::StatusOr<Value> StringList(std::vector<std::string> parts, RenderState& state,
                                 bool tuple = false) {
  std::vector<Value> items;
  for (auto& p : parts) {
    auto v = state.heap().NewString(std::move(p));
    if (!v.ok()) return v.status();
    items.push_back(std::move(*v));
  }
  return state.heap().NewSequence(std::move(items), tuple);
}

// The part of `s` that str methods' optional start and end arguments (a[1], a[2]) select,
// counted in code points and clamped as Python slices are.
absl::StatusOr<std::string_view> Window(const std::string& s, std::string_view name,
                                        const Args& a) {
  auto start = OptionalInt(name, a[1], 0);
  auto end = OptionalInt(name, a[2], INT64_MAX / 2);
  if (!start.ok()) return start.status();
  if (!end.ok()) return end.status();
  size_t b, e;
  PyCodePointRange(s, *start, *end, &b, &e);
  return std::string_view(s).substr(b, e - b);
}

absl::StatusOr<Value> AffixTest(const std::string& s, std::string_view name, const Args& a) {
  std::vector<std::string> affixes;
  const Value& arg = *a[0];
  if (arg.is_string()) {
    affixes.push_back(arg.str());
  } else if (arg.kind() == ValueKind::kTuple) {
    for (const Value& v : arg.list()->items) {
      if (!v.is_string()) return ArgTypeError(name, "str or a tuple of str", v);
      affixes.push_back(v.str());
    }
  } else {
    return ArgTypeError(name, "str or a tuple of str", arg);
  }
  absl::StatusOr<std::string_view> selected = Window(s, name, a);
  if (!selected.ok()) return selected.status();
  const std::string_view window = *selected;
  for (const std::string& affix : affixes) {
    bool hit = name == "startswith" ? window.substr(0, affix.size()) == affix
                                    : window.size() >= affix.size() &&
                                          window.substr(window.size() - affix.size()) == affix;
    if (hit) return Value::Bool(true);
  }
  return Value::Bool(false);
}

absl::StatusOr<Value> FindLike(const std::string& s, std::string_view name, const Args& a) {
  if (!a[0]->is_string()) return ArgTypeError(name, "str", *a[0]);
  absl::StatusOr<std::string_view> selected = Window(s, name, a);
  if (!selected.ok()) return selected.status();
  const std::string_view window = *selected;
  const std::string& sub = a[0]->str();
  if (name == "count") return Value::Integer(static_cast<Int>(PyCount(window, sub)));
  bool reverse = name == "rfind" || name == "rindex";
  size_t hit = reverse ? window.rfind(sub) : window.find(sub);
  if (hit == std::string_view::npos || (window.size() < sub.size() && !sub.empty())) {
    if (name == "index" || name == "rindex") {
      return absl::InvalidArgumentError("substring not found");
    }
    return Value::Integer(-1);
  }
  const size_t begin = static_cast<size_t>(window.data() - s.data());
  return Value::Integer(static_cast<Int>(CodePointIndex(s, begin + hit)));
}

absl::StatusOr<Value> Justify(const std::string& s, std::string_view name, const Args& a,
                              RenderState& state) {
  auto width = OptionalInt(name, a[0], 0);
  if (!width.ok()) return width.status();
  std::string fill = " ";
  if (a.size() > 1 && a[1]) {
    if (!a[1]->is_string() || CodePointCount(a[1]->str()) != 1) {
      return absl::InvalidArgumentError("The fill character must be exactly one character long");
    }
    fill = a[1]->str();
  }
  int64_t len = static_cast<int64_t>(CodePointCount(s));
  int64_t pad = std::max<int64_t>(0, *width - len);
  if (static_cast<uint64_t>(pad) * fill.size() > state.heap().max_string_bytes()) {
    return absl::ResourceExhaustedError("string too long");
  }
  auto repeat = [&](int64_t n) {
    std::string out;
    for (int64_t i = 0; i < n; ++i) out += fill;
    return out;
  };
  std::string out;
  if (name == "ljust") {
    out = s + repeat(pad);
  } else if (name == "rjust") {
    out = repeat(pad) + s;
  } else if (name == "zfill") {
    size_t sign = !s.empty() && (s[0] == '-' || s[0] == '+') ? 1 : 0;
    out = s.substr(0, sign) + std::string(static_cast<size_t>(pad), '0') + s.substr(sign);
  } else {  // center, with CPython's rule for where the odd space goes
    int64_t left = pad / 2 + (pad & *width & 1);
    out = repeat(left) + s + repeat(pad - left);
  }
  return state.heap().NewString(std::move(out));
}

absl::StatusOr<Value> StrPredicate(const std::string& s, std::string_view name) {
  if (name == "islower" || name == "isupper") {
    bool cased = false;
    for (size_t pos = 0; pos < s.size();) {
      char32_t c = NextCodePoint(s, &pos);
      bool lower = IsPyLower(c), upper = IsPyUpper(c);
      if (name == "islower" ? upper : lower) return Value::Bool(false);
      cased = cased || lower || upper;
    }
    return Value::Bool(cased);
  }
  if (s.empty()) return Value::Bool(false);
  for (size_t pos = 0; pos < s.size();) {
    char32_t c = NextCodePoint(s, &pos);
    bool ok = name == "isdigit"   ? IsPyDigit(c)
              : name == "isalpha" ? IsPyAlpha(c)
              : name == "isalnum" ? IsPyAlpha(c) || IsPyDigit(c)
                                  : IsPySpace(c);
    if (!ok) return Value::Bool(false);
  }
  return Value::Bool(true);
}

absl::StatusOr<Value> StripOrSplit(const std::string& s, std::string_view name,
                                   const CallArgs& args, RenderState& state) {
  if (name == "splitlines") {
    auto a = BindArgs(name, args, {"keepends"});
    if (!a.ok()) return a.status();
    return StringList(PySplitLines(s, (*a)[0] && Truthy(*(*a)[0])), state);
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    auto a = BindArgs(name, args, {"chars"});
    if (!a.ok()) return a.status();
    auto chars = OptionalStr(name, (*a)[0]);
    if (!chars.ok()) return chars.status();
    return state.heap().NewString(PyStrip(s, *chars, name != "rstrip", name != "lstrip"));
  }
  auto a = BindArgs(name, args, {"sep", "maxsplit"});
  if (!a.ok()) return a.status();
  auto sep = OptionalStr(name, (*a)[0]);
  auto maxsplit = OptionalInt(name, (*a)[1], -1);
  if (!sep.ok()) return sep.status();
  if (!maxsplit.ok()) return maxsplit.status();
  if (*sep && (*sep)->empty()) return absl::InvalidArgumentError("empty separator");
  if (auto st = state.heap().ChargeItems(s.size() / 2 + 1); !st.ok()) return st;
  return StringList(name == "split" ? PySplit(s, *sep, *maxsplit) : PyRSplit(s, *sep, *maxsplit),
                    state);
}

absl::StatusOr<Value> Replace(const std::string& s, const Args& a, RenderState& state) {
  if (!a[0]->is_string()) return ArgTypeError("replace", "str", *a[0]);
  if (!a[1]->is_string()) return ArgTypeError("replace", "str", *a[1]);
  auto count = OptionalInt("replace", a[2], -1);
  if (!count.ok()) return count.status();
  const std::string& from = a[0]->str();
  const std::string& to = a[1]->str();
  if (to.size() > from.size() &&
      PyCount(s, from) * (to.size() - from.size()) > state.heap().max_string_bytes()) {
    return absl::ResourceExhaustedError("string too long");
  }
  return state.heap().NewString(PyReplace(s, from, to, *count));
}

absl::StatusOr<Value> Join(const std::string& s, const Value& iterable, RenderState& state) {
  auto items = Iterate(iterable, state);
  if (!items.ok()) return items.status();
  std::string out;
  for (size_t i = 0; i < items->size(); ++i) {
    const Value& item = (*items)[i];
    if (!item.is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence item ", i, ": expected str instance, ", TypeName(item), " found"));
    }
    if (i > 0) out += s;
    out += item.str();
    if (out.size() > state.heap().max_string_bytes()) break;  // NewString refuses it
  }
  return state.heap().NewString(std::move(out));
}

// removeprefix, removesuffix, partition, rpartition.
absl::StatusOr<Value> Cut(const std::string& s, std::string_view name, const Value& arg,
                          RenderState& state) {
  if (!arg.is_string()) return ArgTypeError(name, "str", arg);
  const std::string& sep = arg.str();
  std::string_view view = s;
  if (name == "removeprefix") {
    if (view.substr(0, sep.size()) == sep) view.remove_prefix(sep.size());
    return state.heap().NewString(std::string(view));
  }
  if (name == "removesuffix") {
    if (!sep.empty() && view.size() >= sep.size() && view.substr(view.size() - sep.size()) == sep) {
      view.remove_suffix(sep.size());
    }
    return state.heap().NewString(std::string(view));
  }
  if (sep.empty()) return absl::InvalidArgumentError("empty separator");
  size_t hit = name == "partition" ? s.find(sep) : s.rfind(sep);
  if (hit == std::string::npos) {
    return StringList(name == "partition" ? std::vector<std::string>{s, "", ""}
                                          : std::vector<std::string>{"", "", s},
                      state, true);
  }
  return StringList({s.substr(0, hit), sep, s.substr(hit + sep.size())}, state, true);
}

// Methods without arguments: case changes and is*() predicates.
absl::StatusOr<Value> NoArgMethod(const std::string& s, std::string_view name, RenderState& state) {
  auto& heap = state.heap();
  if (name == "upper") return heap.NewString(PyUpper(s));
  if (name == "lower" || name == "casefold") return heap.NewString(PyLower(s));
  if (name == "title") return heap.NewString(PyTitle(s));
  if (name == "capitalize") return heap.NewString(PyCapitalize(s));
  if (name == "swapcase") {
    std::string out;
    for (size_t pos = 0; pos < s.size();) {
      size_t begin = pos;
      char32_t c = NextCodePoint(s, &pos);
      std::string one = s.substr(begin, pos - begin);
      out += IsPyUpper(c) ? PyLower(one) : IsPyLower(c) ? PyUpper(one) : one;
    }
    return heap.NewString(std::move(out));
  }
  return StrPredicate(s, name);
}

absl::StatusOr<Value> StrMethod(const std::string& s, std::string_view name, const CallArgs& args,
                                RenderState& state) {
  if (name == "format") {
    auto out = BraceFormat(s, args, state);
    if (!out.ok()) return out.status();
    return state.heap().NewString(std::move(*out));
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip" || name == "split" ||
      name == "rsplit" || name == "splitlines") {
    return StripOrSplit(s, name, args, state);
  }
  absl::StatusOr<Args> a;
  if (name == "startswith" || name == "endswith") {
    a = BindArgs(name, args, {"prefix", "start", "end"}, 1);
    return a.ok() ? AffixTest(s, name, *a) : a.status();
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
    a = BindArgs(name, args, {"sub", "start", "end"}, 1);
    return a.ok() ? FindLike(s, name, *a) : a.status();
  }
  if (name == "replace") {
    a = BindArgs(name, args, {"old", "new", "count"}, 2);
    return a.ok() ? Replace(s, *a, state) : a.status();
  }
  if (name == "join") {
    a = BindArgs(name, args, {"iterable"}, 1);
    return a.ok() ? Join(s, *(*a)[0], state) : a.status();
  }
  if (name == "removeprefix" || name == "removesuffix" || name == "partition" ||
      name == "rpartition") {
    a = BindArgs(name, args, {"arg"}, 1);
    return a.ok() ? Cut(s, name, *(*a)[0], state) : a.status();
  }
  if (name == "center" || name == "ljust" || name == "rjust" || name == "zfill") {
    a = name == "zfill" ? BindArgs(name, args, {"width"}, 1)
                        : BindArgs(name, args, {"width", "fillchar"}, 1);
    return a.ok() ? Justify(s, name, *a, state) : a.status();
  }
  a = BindArgs(name, args, {}, 0);
  return a.ok() ? NoArgMethod(s, name, state) : a.status();
}

}  // namespace

bool HasMethod(const Value& receiver, std::string_view name) {
  switch (receiver.kind()) {
    case ValueKind::kString:
      return In(name, kStrMethods);
    case ValueKind::kList:
      return In(name, kListMethods);
    case ValueKind::kTuple:
      return name == "index" || name == "count";
    case ValueKind::kDict:
      return In(name, kDictMethods);
    case ValueKind::kLoop:
      return name == "cycle" || name == "changed";
    default:
      return false;
  }
}

absl::StatusOr<Value> CallMethod(const Value& receiver, std::string_view name, const CallArgs& args,
                                 RenderState& state) {
  switch (receiver.kind()) {
    case ValueKind::kString:
      return StrMethod(receiver.str(), name, args, state);
    case ValueKind::kList:
    case ValueKind::kTuple:
      return ListMethod(receiver, name, args, state);
    case ValueKind::kDict:
      return DictMethod(receiver, name, args, state);
    case ValueKind::kLoop:
      return LoopMethod(receiver, name, args, state);
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "'", TypeName(receiver), "' object has no method '", std::string(name), "'"));
  }
}

}  // namespace tandem::chat
