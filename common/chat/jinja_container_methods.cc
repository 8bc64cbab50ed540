#include "common/chat/jinja_container_methods.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/chat/jinja_access.h"
#include "common/chat/jinja_format.h"
#include "common/chat/jinja_ops.h"

namespace tandem::chat {
namespace {

absl::StatusOr<Int> IndexArg(std::string_view method, const std::optional<Value>& v, Int fallback) {
  if (!v || v->is_none()) return fallback;
  if (!v->is_integral()) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", TypeName(*v), "' object cannot be interpreted as an integer in ",
                     std::string(method), "()"));
  }
  return v->int_value();
}

// Python's clamping of a start/end index into [0, n].
size_t Clamp(Int i, size_t n) {
  Int len = static_cast<Int>(n);
  if (i < 0) i += len;
  return static_cast<size_t>(std::clamp<Int>(i, 0, len));
}

absl::StatusOr<Value> ListSearch(const std::vector<Value>& items, std::string_view name,
                                 const CallArgs& args) {
  if (name == "count") {
    auto a = BindArgs(name, args, {"value"}, 1);
    if (!a.ok()) return a.status();
    Int n = 0;
    for (const Value& v : items) n += Equals(v, *(*a)[0]) ? 1 : 0;
    return Value::Integer(n);
  }
  auto a = BindArgs(name, args, {"value", "start", "stop"}, 1);
  if (!a.ok()) return a.status();
  auto start = IndexArg(name, (*a)[1], 0);
  auto stop = IndexArg(name, (*a)[2], static_cast<Int>(items.size()));
  if (!start.ok()) return start.status();
  if (!stop.ok()) return stop.status();
  for (size_t i = Clamp(*start, items.size()); i < Clamp(*stop, items.size()); ++i) {
    if (Equals(items[i], *(*a)[0])) return Value::Integer(static_cast<Int>(i));
  }
  std::string repr;
  (void)AppendRepr(*(*a)[0], FormatLimits{8, 200}, &repr);
  return absl::InvalidArgumentError(absl::StrCat(repr, " is not in list"));
}

absl::StatusOr<Value> ListPop(std::vector<Value>& items, const CallArgs& args) {
  auto a = BindArgs("pop", args, {"index"}, 0);
  if (!a.ok()) return a.status();
  if (items.empty()) return absl::InvalidArgumentError("pop from empty list");
  auto index = IndexArg("pop", (*a)[0], -1);
  if (!index.ok()) return index.status();
  Int i = *index < 0 ? *index + static_cast<Int>(items.size()) : *index;
  if (i < 0 || i >= static_cast<Int>(items.size())) {
    return absl::InvalidArgumentError("pop index out of range");
  }
  Value out = items[static_cast<size_t>(i)];
  items.erase(items.begin() + static_cast<std::ptrdiff_t>(i));
  return out;
}

absl::StatusOr<Value> ItemsOf(const Dict& d, std::string_view name, RenderState& state) {
  if (auto s = state.heap().ChargeItems(d.size()); !s.ok()) return s;
  std::vector<Value> out;
  out.reserve(d.size());
  for (const auto& [k, v] : d.entries()) {
    if (name == "keys") {
      out.push_back(k);
    } else if (name == "values") {
      out.push_back(v);
    } else {
      auto pair = state.heap().NewSequence({k, v}, /*tuple=*/true);
      if (!pair.ok()) return pair.status();
      out.push_back(std::move(*pair));
    }
  }
  return state.heap().NewSequence(std::move(out));
}

absl::Status Update(Dict& d, const CallArgs& args, RenderState& state) {
  if (args.positional.size() > 1) {
    return absl::InvalidArgumentError("update expected at most 1 argument");
  }
  if (!args.positional.empty()) {
    const Value& src = args.positional[0];
    if (!src.is_dict()) {
      return absl::InvalidArgumentError(
          absl::StrCat("update() argument must be a dict, not ", TypeName(src)));
    }
    if (auto s = state.heap().ChargeItems(src.dict()->size()); !s.ok()) return s;
    for (const auto& [k, v] : src.dict()->entries()) {
      if (auto s = d.Set(k, v); !s.ok()) return s;
    }
  }
  if (auto s = state.heap().ChargeItems(args.keyword.size()); !s.ok()) return s;
  for (const auto& [k, v] : args.keyword) d.SetString(k, v);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Value> ListMethod(const Value& list, std::string_view name, const CallArgs& args,
                                 RenderState& state) {
  std::vector<Value>& items = list.list()->items;
  if (name == "index" || name == "count") return ListSearch(items, name, args);
  if (name == "pop") return ListPop(items, args);
  if (name == "append" || name == "remove") {
    auto a = BindArgs(name, args, {"value"}, 1);
    if (!a.ok()) return a.status();
    if (name == "append") {
      if (auto s = state.heap().ChargeItems(1); !s.ok()) return s;
      items.push_back(*(*a)[0]);
      return Value::None();
    }
    auto it = std::find_if(items.begin(), items.end(),
                           [&](const Value& v) { return Equals(v, *(*a)[0]); });
    if (it == items.end()) return absl::InvalidArgumentError("list.remove(x): x not in list");
    items.erase(it);
    return Value::None();
  }
  if (name == "insert") {
    auto a = BindArgs(name, args, {"index", "value"}, 2);
    if (!a.ok()) return a.status();
    auto index = IndexArg(name, (*a)[0], 0);
    if (!index.ok()) return index.status();
    if (auto s = state.heap().ChargeItems(1); !s.ok()) return s;
    items.insert(items.begin() + static_cast<std::ptrdiff_t>(Clamp(*index, items.size())),
                 *(*a)[1]);
    return Value::None();
  }
  if (name == "extend") {
    auto a = BindArgs(name, args, {"iterable"}, 1);
    if (!a.ok()) return a.status();
    auto more = Iterate(*(*a)[0], state);
    if (!more.ok()) return more.status();
    if (auto s = state.heap().ChargeItems(more->size()); !s.ok()) return s;
    items.insert(items.end(), more->begin(), more->end());
    return Value::None();
  }
  auto a = BindArgs(name, args, {}, 0);
  if (!a.ok()) return a.status();
  if (name == "copy") return state.heap().NewSequence(items);
  if (name == "clear") {
    items.clear();
  } else {  // reverse
    std::reverse(items.begin(), items.end());
  }
  return Value::None();
}

absl::StatusOr<Value> DictMethod(const Value& dict, std::string_view name, const CallArgs& args,
                                 RenderState& state) {
  Dict& d = *dict.dict();
  if (name == "items" || name == "keys" || name == "values") {
    auto a = BindArgs(name, args, {}, 0);
    if (!a.ok()) return a.status();
    return ItemsOf(d, name, state);
  }
  if (name == "update") {
    if (auto s = Update(d, args, state); !s.ok()) return s;
    return Value::None();
  }
  if (name == "copy") {
    auto copy = state.heap().NewDict();
    if (!copy.ok()) return copy.status();
    if (auto s = state.heap().ChargeItems(d.size()); !s.ok()) return s;
    **copy = d;
    return Value::DictOf(*copy);
  }
  auto a = BindArgs(name, args, {"key", "default"}, 1);
  if (!a.ok()) return a.status();
  const Value& key = *(*a)[0];
  auto found = d.Find(key);
  if (!found.ok()) return found.status();
  Value fallback = (*a)[1] ? *(*a)[1] : Value::None();
  if (name == "get") return *found ? **found : fallback;
  if (name == "setdefault") {
    if (*found) return **found;
    if (auto s = state.heap().ChargeItems(1); !s.ok()) return s;
    if (auto s = d.Set(key, fallback); !s.ok()) return s;
    return fallback;
  }
  // pop
  if (!*found) {
    if ((*a)[1]) return fallback;
    std::string repr;
    (void)AppendRepr(key, FormatLimits{8, 200}, &repr);
    return absl::InvalidArgumentError(absl::StrCat("KeyError: ", repr));
  }
  Value out = **found;
  auto erased = d.Erase(key);
  if (!erased.ok()) return erased.status();
  return out;
}

absl::StatusOr<Value> LoopMethod(const Value& loop, std::string_view name, const CallArgs& args,
                                 RenderState& state) {
  LoopState& l = *loop.loop();
  if (!args.keyword.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("loop.", std::string(name), "() takes no keyword arguments"));
  }
  if (name == "cycle") {
    if (args.positional.empty()) return absl::InvalidArgumentError("no items for cycling given");
    return args.positional[l.index0 % args.positional.size()];
  }
  auto now = state.heap().NewSequence(args.positional, /*tuple=*/true);
  if (!now.ok()) return now.status();
  if (l.has_changed_value && Equals(l.changed_value, *now)) return Value::Bool(false);
  l.has_changed_value = true;
  l.changed_value = *now;
  return Value::Bool(true);
}

}  // namespace tandem::chat
