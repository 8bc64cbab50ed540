#include "common/chat/jinja_seq_filters.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/chat/jinja_access.h"
#include "common/chat/jinja_format.h"
#include "common/chat/jinja_ops.h"
#include "common/chat/py_strings.h"

namespace tandem::chat {
namespace {

using Result = absl::StatusOr<Value>;

// Jinja's ignore_case: strings compare lowercased unless case_sensitive.
Value SortKey(const Value& v, bool case_sensitive) {
  if (case_sensitive || !v.is_string()) return v;
  return Value::String(PyLower(v.str()));
}

// Sorts `items` by `keys` (parallel), stably; TypeError between unorderable keys.
absl::Status SortBy(std::vector<Value>& items, const std::vector<Value>& keys, bool reverse) {
  std::vector<size_t> order(items.size());
  std::iota(order.begin(), order.end(), 0);
  absl::Status error;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (!error.ok()) return false;
    auto c = Compare(keys[a], keys[b]);
    if (!c.ok()) {
      error = c.status();
      return false;
    }
    return reverse ? *c > 0 : *c < 0;
  });
  if (!error.ok()) return error;
  std::vector<Value> sorted;
  sorted.reserve(items.size());
  for (size_t i : order) sorted.push_back(items[i]);
  items = std::move(sorted);
  return absl::OkStatus();
}

// The value of attribute path(s) `attribute` ("a.b", or "a,b" for several) of `item`.
absl::StatusOr<Value> AttrKey(const Value& item, const std::optional<Value>& attribute,
                              bool case_sensitive, RenderState& state) {
  if (!attribute || attribute->is_none()) return SortKey(item, case_sensitive);
  if (attribute->is_integral()) {
    auto v = GetItem(item, *attribute, state);
    if (!v.ok()) return v;
    return SortKey(*v, case_sensitive);
  }
  auto path = ToStr(*attribute, state.format());
  if (!path.ok()) return path.status();
  std::vector<std::string> parts = absl::StrSplit(*path, ',');
  std::vector<Value> keys;
  for (const std::string& part : parts) {
    auto v = GetPath(item, PyStrip(part, std::nullopt, true, true), state);
    if (!v.ok()) return v;
    keys.push_back(SortKey(*v, case_sensitive));
  }
  if (keys.size() == 1) return keys[0];
  return state.heap().NewSequence(std::move(keys), /*tuple=*/true);
}

absl::StatusOr<Value> ListOf(std::vector<Value> items, RenderState& state) {
  return state.heap().NewSequence(std::move(items));
}

// select/reject(test, args...) and selectattr/rejectattr(attr, test, args...).
Result SelectOrReject(const Value& v, const CallArgs& args, RenderState& state, bool select,
                      bool by_attr) {
  auto items = Iterate(v, state);
  if (!items.ok()) return items.status();
  size_t off = by_attr ? 1 : 0;
  if (by_attr && args.positional.empty()) {
    return absl::InvalidArgumentError("Missing parameter for attribute name");
  }
  TestFn test = nullptr;
  CallArgs test_args;
  if (args.positional.size() > off) {
    const Value& name = args.positional[off];
    if (!name.is_string() || (test = FindTest(name.str())) == nullptr) {
      return absl::InvalidArgumentError("select/reject: unknown test");
    }
    test_args.positional.assign(args.positional.begin() + off + 1, args.positional.end());
    test_args.keyword = args.keyword;
  }
  std::vector<Value> out;
  for (const Value& item : *items) {
    Value subject = item;
    if (by_attr) {
      auto attr = AttrKey(item, args.positional[0], true, state);
      if (!attr.ok()) return attr.status();
      subject = std::move(*attr);
    }
    bool hit;
    if (test) {
      auto r = test(subject, test_args, state);
      if (!r.ok()) return r.status();
      hit = *r;
    } else {
      hit = Truthy(subject);
    }
    if (hit == select) out.push_back(item);
  }
  return ListOf(std::move(out), state);
}

Result MinMax(const Value& v, const CallArgs& args, RenderState& state, bool max) {
  auto a = BindArgs(max ? "max" : "min", args, {"case_sensitive", "attribute"});
  if (!a.ok()) return a.status();
  auto items = Iterate(v, state);
  if (!items.ok()) return items.status();
  if (items->empty()) return Value();
  bool case_sensitive = (*a)[0] && Truthy(*(*a)[0]);
  size_t best = 0;
  Value best_key;
  for (size_t i = 0; i < items->size(); ++i) {
    auto key = AttrKey((*items)[i], (*a)[1], case_sensitive, state);
    if (!key.ok()) return key.status();
    if (i > 0) {
      auto c = Compare(*key, best_key);
      if (!c.ok()) return c.status();
      if (max ? *c <= 0 : *c >= 0) continue;
    }
    best = i;
    best_key = *key;
  }
  return (*items)[best];
}

}  // namespace

Result FilterLength(const Value& v, const CallArgs& args, RenderState&) {
  auto n = Length(v);
  if (!n.ok()) return n.status();
  return Value::Integer(static_cast<Int>(*n));
}

Result FilterList(const Value& v, const CallArgs& args, RenderState& state) {
  auto items = Iterate(v, state);
  if (!items.ok()) return items.status();
  return ListOf(std::move(*items), state);
}

Result FilterFirst(const Value& v, const CallArgs& args, RenderState& state) {
  if (v.is_string()) return GetItem(v, Value::Integer(0), state);
  auto items = Iterate(v, state);
  if (!items.ok()) return items.status();
  return items->empty() ? Value() : items->front();
}

Result FilterLast(const Value& v, const CallArgs& args, RenderState& state) {
  if (v.is_string()) return GetItem(v, Value::Integer(-1), state);
  auto items = Iterate(v, state);
  if (!items.ok()) return items.status();
  return items->empty() ? Value() : items->back();
}

Result FilterItems(const Value& v, const CallArgs& args, RenderState& state) {
  if (v.is_undefined()) return ListOf({}, state);
  if (!v.is_dict()) return absl::InvalidArgumentError("Can only get item pairs from a mapping.");
  return CallMethod(v, "items", CallArgs{}, state);
}

Result FilterReverse(const Value& v, const CallArgs& args, RenderState& state) {
  if (v.is_string()) {
    return Slice(v, Value(), Value(), Value::Integer(-1), state);
  }
  auto items = Iterate(v, state);
  if (!items.ok()) return items.status();
  std::reverse(items->begin(), items->end());
  return ListOf(std::move(*items), state);
}

Result FilterJoin(const Value& v, const CallArgs& args, RenderState& state) {
  auto a = BindArgs("join", args, {"d", "attribute"});
  if (!a.ok()) return a.status();
  auto items = Iterate(v, state);
  if (!items.ok()) return items.status();
  std::string sep;
  if ((*a)[0]) {
    auto s = ToStr(*(*a)[0], state.format());
    if (!s.ok()) return s.status();
    sep = *s;
  }
  std::string out;
  for (size_t i = 0; i < items->size(); ++i) {
    Value item = (*items)[i];
    if ((*a)[1]) {
      auto attr = AttrKey(item, (*a)[1], true, state);
      if (!attr.ok()) return attr.status();
      item = *attr;
    }
    if (i > 0) out += sep;
    if (auto s = AppendStr(item, state.format(), &out); !s.ok()) return s;
    if (out.size() > state.heap().max_string_bytes()) break;
  }
  return state.heap().NewString(std::move(out));
}

Result FilterMap(const Value& v, const CallArgs& args, RenderState& state) {
  auto items = Iterate(v, state);
  if (!items.ok()) return items.status();
  std::vector<Value> out;
  if (args.positional.empty()) {
    auto a = BindArgs("map", args, {"attribute", "default"}, 1);
    if (!a.ok()) return a.status();
    for (const Value& item : *items) {
      auto attr = AttrKey(item, (*a)[0], true, state);
      if (!attr.ok()) return attr.status();
      out.push_back(attr->is_undefined() && (*a)[1] ? *(*a)[1] : *attr);
    }
    return ListOf(std::move(out), state);
  }
  const Value& name = args.positional[0];
  FilterFn filter = name.is_string() ? FindFilter(name.str()) : nullptr;
  if (filter == nullptr) return absl::InvalidArgumentError("map: unknown filter");
  CallArgs rest;
  rest.positional.assign(args.positional.begin() + 1, args.positional.end());
  rest.keyword = args.keyword;
  for (const Value& item : *items) {
    auto mapped = filter(item, rest, state);
    if (!mapped.ok()) return mapped.status();
    out.push_back(std::move(*mapped));
  }
  return ListOf(std::move(out), state);
}

Result FilterSelect(const Value& v, const CallArgs& args, RenderState& state) {
  return SelectOrReject(v, args, state, true, false);
}
Result FilterReject(const Value& v, const CallArgs& args, RenderState& state) {
  return SelectOrReject(v, args, state, false, false);
}
Result FilterSelectAttr(const Value& v, const CallArgs& args, RenderState& state) {
  return SelectOrReject(v, args, state, true, true);
}
Result FilterRejectAttr(const Value& v, const CallArgs& args, RenderState& state) {
  return SelectOrReject(v, args, state, false, true);
}

Result FilterSort(const Value& v, const CallArgs& args, RenderState& state) {
  auto a = BindArgs("sort", args, {"reverse", "case_sensitive", "attribute"});
  if (!a.ok()) return a.status();
  auto items = Iterate(v, state);
  if (!items.ok()) return items.status();
  bool case_sensitive = (*a)[1] && Truthy(*(*a)[1]);
  std::vector<Value> keys;
  for (const Value& item : *items) {
    auto key = AttrKey(item, (*a)[2], case_sensitive, state);
    if (!key.ok()) return key.status();
    keys.push_back(std::move(*key));
  }
  if (auto s = SortBy(*items, keys, (*a)[0] && Truthy(*(*a)[0])); !s.ok()) return s;
  return ListOf(std::move(*items), state);
}

Result FilterDictSort(const Value& v, const CallArgs& args, RenderState& state) {
  auto a = BindArgs("dictsort", args, {"case_sensitive", "by", "reverse"});
  if (!a.ok()) return a.status();
  if (!v.is_dict()) return absl::InvalidArgumentError("dictsort: a dict is required");
  bool case_sensitive = (*a)[0] && Truthy(*(*a)[0]);
  bool by_value = (*a)[1] && (*a)[1]->is_string() && (*a)[1]->str() == "value";
  if ((*a)[1] && !by_value && !((*a)[1]->is_string() && (*a)[1]->str() == "key")) {
    return absl::InvalidArgumentError("You can only sort by either \"key\" or \"value\"");
  }
  std::vector<Value> items, keys;
  for (const auto& [k, val] : v.dict()->entries()) {
    auto pair = state.heap().NewSequence({k, val}, /*tuple=*/true);
    if (!pair.ok()) return pair.status();
    items.push_back(*pair);
    keys.push_back(SortKey(by_value ? val : k, case_sensitive));
  }
  if (auto s = SortBy(items, keys, (*a)[2] && Truthy(*(*a)[2])); !s.ok()) return s;
  return ListOf(std::move(items), state);
}

Result FilterUnique(const Value& v, const CallArgs& args, RenderState& state) {
  auto a = BindArgs("unique", args, {"case_sensitive", "attribute"});
  if (!a.ok()) return a.status();
  auto items = Iterate(v, state);
  if (!items.ok()) return items.status();
  bool case_sensitive = (*a)[0] && Truthy(*(*a)[0]);
  std::vector<Value> out, seen;
  for (const Value& item : *items) {
    auto key = AttrKey(item, (*a)[1], case_sensitive, state);
    if (!key.ok()) return key.status();
    bool dup =
        std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return Equals(s, *key); });
    if (dup) continue;
    seen.push_back(*key);
    out.push_back(item);
  }
  return ListOf(std::move(out), state);
}

Result FilterMax(const Value& v, const CallArgs& args, RenderState& state) {
  return MinMax(v, args, state, true);
}
Result FilterMin(const Value& v, const CallArgs& args, RenderState& state) {
  return MinMax(v, args, state, false);
}

Result FilterSum(const Value& v, const CallArgs& args, RenderState& state) {
  auto a = BindArgs("sum", args, {"attribute", "start"});
  if (!a.ok()) return a.status();
  auto items = Iterate(v, state);
  if (!items.ok()) return items.status();
  Value total = (*a)[1] ? *(*a)[1] : Value::Integer(0);
  for (const Value& item : *items) {
    auto x = AttrKey(item, (*a)[0], true, state);
    if (!x.ok()) return x.status();
    auto sum = BinaryOperation(BinaryOp::kAdd, total, *x, state);
    if (!sum.ok()) return sum.status();
    total = std::move(*sum);
  }
  return total;
}

Result FilterBatch(const Value& v, const CallArgs& args, RenderState& state) {
  auto a = BindArgs("batch", args, {"linecount", "fill_with"}, 1);
  if (!a.ok()) return a.status();
  if (!(*a)[0]->is_integral() || (*a)[0]->int_value() <= 0) {
    return absl::InvalidArgumentError("batch: linecount must be a positive integer");
  }
  size_t n = static_cast<size_t>(std::min<Int>((*a)[0]->int_value(), 1 << 20));
  auto items = Iterate(v, state);
  if (!items.ok()) return items.status();
  std::vector<Value> out, row;
  for (const Value& item : *items) {
    row.push_back(item);
    if (row.size() == n) {
      auto list = ListOf(std::move(row), state);
      if (!list.ok()) return list;
      out.push_back(*list);
      row.clear();
    }
  }
  if (!row.empty()) {
    if ((*a)[1] && !(*a)[1]->is_none()) row.resize(n, *(*a)[1]);
    auto list = ListOf(std::move(row), state);
    if (!list.ok()) return list;
    out.push_back(*list);
  }
  return ListOf(std::move(out), state);
}

}  // namespace tandem::chat
