// Jinja's built-in tests (`x is defined`, `n is divisibleby 3`, `selectattr('a', 'equalto', 1)`).
#include <cmath>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "common/chat/jinja_builtins.h"
#include "common/chat/jinja_format.h"
#include "common/chat/jinja_ops.h"
#include "common/chat/py_strings.h"
#include "common/chat/render_state.h"

namespace tandem::chat {
namespace {

using Result = absl::StatusOr<bool>;

absl::StatusOr<Value> OneArg(std::string_view test, const CallArgs& args) {
  auto bound = BindArgs(test, args, {"other"}, 1);
  if (!bound.ok()) return bound.status();
  return *(*bound)[0];
}

Result Defined(const Value& v, const CallArgs&, RenderState&) { return !v.is_undefined(); }
Result Undefined(const Value& v, const CallArgs&, RenderState&) { return v.is_undefined(); }
Result None(const Value& v, const CallArgs&, RenderState&) { return v.is_none(); }
Result Boolean(const Value& v, const CallArgs&, RenderState&) { return v.is_bool(); }
Result True(const Value& v, const CallArgs&, RenderState&) { return v.is_bool() && v.bool_value(); }
Result False(const Value& v, const CallArgs&, RenderState&) {
  return v.is_bool() && !v.bool_value();
}
Result Integer(const Value& v, const CallArgs&, RenderState&) { return v.is_int(); }
Result Float(const Value& v, const CallArgs&, RenderState&) { return v.is_float(); }
Result Number(const Value& v, const CallArgs&, RenderState&) { return v.is_number(); }
Result String(const Value& v, const CallArgs&, RenderState&) { return v.is_string(); }
Result Mapping(const Value& v, const CallArgs&, RenderState&) { return v.is_dict(); }
Result Escaped(const Value&, const CallArgs&, RenderState&) { return false; }

// Jinja: len() and __getitem__ work (Undefined has both).
Result Sequence(const Value& v, const CallArgs&, RenderState&) {
  return v.is_undefined() || v.is_string() || v.is_sequence() || v.is_dict();
}
Result Iterable(const Value& v, const CallArgs&, RenderState&) {
  return v.is_undefined() || v.is_string() || v.is_sequence() || v.is_dict();
}
Result Callable(const Value& v, const CallArgs&, RenderState&) {
  return v.is_callable() || v.kind() == ValueKind::kLoop;
}

absl::StatusOr<Value> Mod2(const Value& v, const Value& d, RenderState& state) {
  return BinaryOperation(BinaryOp::kMod, v, d, state);
}

Result Odd(const Value& v, const CallArgs&, RenderState& state) {
  auto m = Mod2(v, Value::Integer(2), state);
  if (!m.ok()) return m.status();
  return Equals(*m, Value::Integer(1));
}
Result Even(const Value& v, const CallArgs&, RenderState& state) {
  auto m = Mod2(v, Value::Integer(2), state);
  if (!m.ok()) return m.status();
  return Equals(*m, Value::Integer(0));
}
Result DivisibleBy(const Value& v, const CallArgs& args, RenderState& state) {
  auto d = OneArg("divisibleby", args);
  if (!d.ok()) return d.status();
  auto m = Mod2(v, *d, state);
  if (!m.ok()) return m.status();
  return Equals(*m, Value::Integer(0));
}

template <CompareOp kOp>
Result CompareTest(const Value& v, const CallArgs& args, RenderState&) {
  auto other = OneArg("compare", args);
  if (!other.ok()) return other.status();
  return CompareWith(kOp, v, *other);
}

Result In(const Value& v, const CallArgs& args, RenderState&) {
  auto seq = OneArg("in", args);
  if (!seq.ok()) return seq.status();
  return Contains(*seq, v);
}

Result SameAs(const Value& v, const CallArgs& args, RenderState&) {
  auto other = OneArg("sameas", args);
  if (!other.ok()) return other.status();
  const Value& o = *other;
  if (v.kind() != o.kind()) return false;
  switch (v.kind()) {
    case ValueKind::kList:
    case ValueKind::kTuple:
      return v.list() == o.list();
    case ValueKind::kDict:
    case ValueKind::kNamespace:
      return v.dict() == o.dict();
    case ValueKind::kCallable:
      return v.callable() == o.callable();
    case ValueKind::kLoop:
      return v.loop() == o.loop();
    default:
      return Equals(v, o);
  }
}

// str(v).islower() / isupper(): some cased character, and every cased one in that case.
Result CaseTest(const Value& v, RenderState& state, bool lower) {
  auto s = ToStr(v, state.format());
  if (!s.ok()) return s.status();
  bool cased = false;
  for (size_t pos = 0; pos < s->size();) {
    char32_t c = NextCodePoint(*s, &pos);
    if (lower ? IsPyUpper(c) : IsPyLower(c)) return false;
    if (lower ? IsPyLower(c) : IsPyUpper(c)) cased = true;
  }
  return cased;
}
Result Lower(const Value& v, const CallArgs&, RenderState& state) {
  return CaseTest(v, state, true);
}
Result Upper(const Value& v, const CallArgs&, RenderState& state) {
  return CaseTest(v, state, false);
}

Result IsFilter(const Value& v, const CallArgs&, RenderState&) {
  return v.is_string() && FindFilter(v.str()) != nullptr;
}
Result IsTest(const Value& v, const CallArgs&, RenderState&) {
  return v.is_string() && FindTest(v.str()) != nullptr;
}

struct TestEntry {
  std::string_view name;
  TestFn fn;
};

constexpr TestEntry kTests[] = {
    {"defined", Defined},
    {"undefined", Undefined},
    {"none", None},
    {"boolean", Boolean},
    {"true", True},
    {"false", False},
    {"integer", Integer},
    {"float", Float},
    {"number", Number},
    {"string", String},
    {"mapping", Mapping},
    {"sequence", Sequence},
    {"iterable", Iterable},
    {"callable", Callable},
    {"escaped", Escaped},
    {"odd", Odd},
    {"even", Even},
    {"divisibleby", DivisibleBy},
    {"eq", CompareTest<CompareOp::kEq>},
    {"equalto", CompareTest<CompareOp::kEq>},
    {"==", CompareTest<CompareOp::kEq>},
    {"ne", CompareTest<CompareOp::kNe>},
    {"!=", CompareTest<CompareOp::kNe>},
    {"lt", CompareTest<CompareOp::kLt>},
    {"lessthan", CompareTest<CompareOp::kLt>},
    {"<", CompareTest<CompareOp::kLt>},
    {"le", CompareTest<CompareOp::kLe>},
    {"<=", CompareTest<CompareOp::kLe>},
    {"gt", CompareTest<CompareOp::kGt>},
    {"greaterthan", CompareTest<CompareOp::kGt>},
    {">", CompareTest<CompareOp::kGt>},
    {"ge", CompareTest<CompareOp::kGe>},
    {">=", CompareTest<CompareOp::kGe>},
    {"in", In},
    {"sameas", SameAs},
    {"lower", Lower},
    {"upper", Upper},
    {"filter", IsFilter},
    {"test", IsTest},
};

}  // namespace

TestFn FindTest(std::string_view name) {
  for (const TestEntry& t : kTests) {
    if (t.name == name) return t.fn;
  }
  return nullptr;
}

}  // namespace tandem::chat
