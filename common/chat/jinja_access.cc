#include "common/chat/jinja_access.h"

#include <algorithm>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/chat/jinja_builtins.h"
#include "common/chat/py_strings.h"

namespace tandem::chat {
namespace {

absl::StatusOr<Value> BoundMethod(const Value& obj, std::string_view name, RenderState& state) {
  auto fn = state.heap().NewCallable();
  if (!fn.ok()) return fn.status();
  (*fn)->type = Callable::Type::kMethod;
  (*fn)->name = std::string(name);
  (*fn)->receiver = obj;
  return Value::CallableOf(*fn);
}

absl::StatusOr<Value> LoopAttr(const Value& obj, std::string_view name, RenderState& state) {
  const LoopState& loop = *obj.loop();
  Int n = static_cast<Int>(loop.items.size());
  Int i = static_cast<Int>(loop.index0);
  if (name == "index0") return Value::Integer(i);
  if (name == "index") return Value::Integer(i + 1);
  if (name == "revindex") return Value::Integer(n - i);
  if (name == "revindex0") return Value::Integer(n - i - 1);
  if (name == "first") return Value::Bool(i == 0);
  if (name == "last") return Value::Bool(i == n - 1);
  if (name == "length") return Value::Integer(n);
  if (name == "depth") return Value::Integer(1);
  if (name == "depth0") return Value::Integer(0);
  if (name == "previtem") return i > 0 ? loop.items[loop.index0 - 1] : Value();
  if (name == "nextitem") return i + 1 < n ? loop.items[loop.index0 + 1] : Value();
  if (name == "cycle" || name == "changed") return BoundMethod(obj, name, state);
  return Value();
}

// Python's slice.indices(len) followed by the walk it describes.
absl::StatusOr<std::vector<size_t>> SliceIndexes(size_t length, const Value& start,
                                                 const Value& stop, const Value& step) {
  auto bound = [](const Value& v, const char* what) -> absl::StatusOr<std::optional<Int>> {
    if (v.is_undefined() || v.is_none()) return std::nullopt;
    if (!v.is_integral()) {
      return absl::InvalidArgumentError(
          absl::StrCat("slice ", what, " must be an integer or None, not ", TypeName(v)));
    }
    return v.int_value();
  };
  auto b = bound(start, "start");
  auto e = bound(stop, "stop");
  auto st = bound(step, "step");
  if (!b.ok()) return b.status();
  if (!e.ok()) return e.status();
  if (!st.ok()) return st.status();
  Int s = st->value_or(1);
  if (s == 0) return absl::InvalidArgumentError("slice step cannot be zero");
  Int n = static_cast<Int>(length);
  Int lower = s > 0 ? 0 : -1, upper = s > 0 ? n : n - 1;
  auto clamp = [&](std::optional<Int> v, Int fallback) {
    if (!v) return fallback;
    Int x = *v < 0 ? *v + n : *v;
    return std::clamp(x, lower, upper);
  };
  Int i = clamp(*b, s > 0 ? lower : upper);
  Int end = clamp(*e, s > 0 ? upper : lower);
  std::vector<size_t> out;
  for (; s > 0 ? i < end : i > end; i += s) out.push_back(static_cast<size_t>(i));
  return out;
}

}  // namespace

absl::StatusOr<Value> GetAttr(const Value& obj, std::string_view name, RenderState& state) {
  switch (obj.kind()) {
    case ValueKind::kDict: {
      if (HasMethod(obj, name)) return BoundMethod(obj, name, state);
      const Value* v = obj.dict()->FindString(name);
      return v ? *v : Value();
    }
    case ValueKind::kNamespace: {
      const Value* v = obj.dict()->FindString(name);
      return v ? *v : Value();
    }
    case ValueKind::kLoop:
      return LoopAttr(obj, name, state);
    case ValueKind::kString:
    case ValueKind::kList:
    case ValueKind::kTuple:
      if (HasMethod(obj, name)) return BoundMethod(obj, name, state);
      return Value();
    default:
      return Value();
  }
}

absl::StatusOr<Value> GetItem(const Value& obj, const Value& key, RenderState& state) {
  switch (obj.kind()) {
    case ValueKind::kDict: {
      auto found = obj.dict()->Find(key);
      if (found.ok() && *found != nullptr) return **found;
      break;
    }
    case ValueKind::kList:
    case ValueKind::kTuple:
    case ValueKind::kString: {
      if (!key.is_integral()) break;
      bool is_str = obj.is_string();
      Int n = is_str ? static_cast<Int>(CodePointCount(obj.str()))
                     : static_cast<Int>(obj.list()->items.size());
      Int i = key.int_value();
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value();
      if (!is_str) return obj.list()->items[static_cast<size_t>(i)];
      size_t begin, end;
      PyCodePointRange(obj.str(), static_cast<int64_t>(i), static_cast<int64_t>(i + 1), &begin,
                       &end);
      return state.heap().NewString(obj.str().substr(begin, end - begin));
    }
    default:
      break;
  }
  if (key.is_string()) return GetAttr(obj, key.str(), state);
  return Value();
}

absl::StatusOr<Value> Slice(const Value& obj, const Value& start, const Value& stop,
                            const Value& step, RenderState& state) {
  if (obj.is_string()) {
    std::vector<size_t> offsets = CodePointOffsets(obj.str());
    auto idx = SliceIndexes(offsets.size() - 1, start, stop, step);
    if (!idx.ok()) return idx.status();
    std::string out;
    for (size_t i : *idx) out.append(obj.str(), offsets[i], offsets[i + 1] - offsets[i]);
    return state.heap().NewString(std::move(out));
  }
  if (obj.is_sequence()) {
    const auto& items = obj.list()->items;
    auto idx = SliceIndexes(items.size(), start, stop, step);
    if (!idx.ok()) return idx.status();
    std::vector<Value> out;
    out.reserve(idx->size());
    for (size_t i : *idx) out.push_back(items[i]);
    return state.heap().NewSequence(std::move(out), obj.kind() == ValueKind::kTuple);
  }
  if (obj.is_undefined()) return Value();
  return absl::InvalidArgumentError(
      absl::StrCat("'", TypeName(obj), "' object is not subscriptable"));
}

absl::StatusOr<size_t> Length(const Value& v) {
  switch (v.kind()) {
    case ValueKind::kUndefined:
      return 0;
    case ValueKind::kString:
      return CodePointCount(v.str());
    case ValueKind::kList:
    case ValueKind::kTuple:
      return v.list()->items.size();
    case ValueKind::kDict:
      return v.dict()->size();
    case ValueKind::kLoop:
      return v.loop()->items.size();
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("object of type '", TypeName(v), "' has no len()"));
  }
}

absl::StatusOr<std::vector<Value>> Iterate(const Value& v, RenderState& state) {
  std::vector<Value> out;
  switch (v.kind()) {
    case ValueKind::kUndefined:
      return out;
    case ValueKind::kList:
    case ValueKind::kTuple:
      out = v.list()->items;
      return out;
    case ValueKind::kDict:
      for (const auto& [k, val] : v.dict()->entries()) out.push_back(k);
      return out;
    case ValueKind::kString: {
      const std::string& s = v.str();
      if (auto st = state.heap().ChargeItems(s.size()); !st.ok()) return st;
      for (size_t pos = 0; pos < s.size();) {
        size_t begin = pos;
        NextCodePoint(s, &pos);
        out.push_back(Value::String(s.substr(begin, pos - begin)));
      }
      return out;
    }
    default:
      return absl::InvalidArgumentError(absl::StrCat("'", TypeName(v), "' object is not iterable"));
  }
}

absl::StatusOr<Value> GetPath(const Value& obj, std::string_view path, RenderState& state) {
  Value cur = obj;
  for (absl::string_view part : absl::StrSplit(absl::string_view(path.data(), path.size()), '.')) {
    absl::StatusOr<Value> next;
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(),
                                               [](char c) { return c >= '0' && c <= '9'; });
    if (digits && part.size() < 18) {
      next =
          GetItem(cur, Value::Integer(std::strtoll(std::string(part).c_str(), nullptr, 10)), state);
    } else {
      next = GetItem(cur, Value::String(std::string(part)), state);
    }
    if (!next.ok()) return next.status();
    cur = std::move(*next);
  }
  return cur;
}

}  // namespace tandem::chat
