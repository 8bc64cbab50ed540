#include "common/chat/jinja_ops.h"

#include <cmath>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "common/chat/jinja_format.h"
#include "common/chat/py_format.h"
#include "common/chat/py_strings.h"

namespace tandem::chat {
namespace {

constexpr int kMaxCompareDepth = 256;

absl::Status TypeError(std::string_view op, const Value& a, const Value& b) {
  return absl::InvalidArgumentError(absl::StrCat("unsupported operand type(s) for ",
                                                 std::string(op), ": '", TypeName(a), "' and '",
                                                 TypeName(b), "'"));
}

absl::Status Overflow() { return absl::InvalidArgumentError("integer overflow"); }
absl::Status ZeroDivision() { return absl::InvalidArgumentError("division by zero"); }

bool EqualsAt(const Value& a, const Value& b, int depth) {
  if (depth > kMaxCompareDepth) return false;
  if (a.is_number() && b.is_number()) {
    if (a.is_integral() && b.is_integral()) return a.int_value() == b.int_value();
    return a.float_value() == b.float_value();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case ValueKind::kUndefined:
    case ValueKind::kNone:
      return true;
    case ValueKind::kString:
      return a.str() == b.str();
    case ValueKind::kList:
    case ValueKind::kTuple: {
      const auto& x = a.list()->items;
      const auto& y = b.list()->items;
      if (a.list() == b.list()) return true;
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i) {
        if (!EqualsAt(x[i], y[i], depth + 1)) return false;
      }
      return true;
    }
    case ValueKind::kDict: {
      if (a.dict() == b.dict()) return true;
      if (a.dict()->size() != b.dict()->size()) return false;
      for (const auto& [k, v] : a.dict()->entries()) {
        auto other = b.dict()->Find(k);
        if (!other.ok() || *other == nullptr || !EqualsAt(v, **other, depth + 1)) return false;
      }
      return true;
    }
    case ValueKind::kNamespace:
      return a.dict() == b.dict();
    case ValueKind::kLoop:
      return a.loop() == b.loop();
    case ValueKind::kCallable:
      return a.callable() == b.callable();
    default:
      return false;
  }
}

absl::StatusOr<int> CompareAt(const Value& a, const Value& b, int depth) {
  if (depth > kMaxCompareDepth) return absl::ResourceExhaustedError("values nested too deeply");
  if (a.is_number() && b.is_number()) {
    if (a.is_integral() && b.is_integral()) {
      return a.int_value() < b.int_value() ? -1 : a.int_value() > b.int_value() ? 1 : 0;
    }
    double x = a.float_value(), y = b.float_value();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    int c = a.str().compare(b.str());
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.kind() == b.kind() && a.is_sequence()) {
    const auto& x = a.list()->items;
    const auto& y = b.list()->items;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (EqualsAt(x[i], y[i], depth + 1)) continue;
      return CompareAt(x[i], y[i], depth + 1);
    }
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  return absl::InvalidArgumentError(absl::StrCat("'<' not supported between instances of '",
                                                 TypeName(a), "' and '", TypeName(b), "'"));
}

absl::StatusOr<Value> IntPow(Int base, Int exp) {
  Int result = 1;
  while (exp > 0) {
    if (exp & 1) {
      if (__builtin_mul_overflow(result, base, &result)) return Overflow();
    }
    exp >>= 1;
    if (exp > 0 && __builtin_mul_overflow(base, base, &base)) return Overflow();
  }
  return Value::Integer(result);
}

absl::StatusOr<Value> IntArith(BinaryOp op, Int a, Int b) {
  Int r = 0;
  switch (op) {
    case BinaryOp::kAdd:
      if (__builtin_add_overflow(a, b, &r)) return Overflow();
      return Value::Integer(r);
    case BinaryOp::kSub:
      if (__builtin_sub_overflow(a, b, &r)) return Overflow();
      return Value::Integer(r);
    case BinaryOp::kMul:
      if (__builtin_mul_overflow(a, b, &r)) return Overflow();
      return Value::Integer(r);
    case BinaryOp::kDiv:
      if (b == 0) return ZeroDivision();
      return Value::Float(static_cast<double>(a) / static_cast<double>(b));
    case BinaryOp::kFloorDiv:
    case BinaryOp::kMod: {
      if (b == 0) return ZeroDivision();
      if (b == -1) {
        if (op == BinaryOp::kMod) return Value::Integer(0);
        if (__builtin_sub_overflow(Int(0), a, &r)) return Overflow();
        return Value::Integer(r);
      }
      Int q = a / b, m = a % b;
      if (m != 0 && ((m < 0) != (b < 0))) {
        q -= 1;
        m += b;
      }
      return Value::Integer(op == BinaryOp::kMod ? m : q);
    }
    case BinaryOp::kPow:
      if (b < 0) {
        if (a == 0) return ZeroDivision();
        return Value::Float(std::pow(static_cast<double>(a), static_cast<double>(b)));
      }
      return IntPow(a, b);
    default:
      return absl::InternalError("not an arithmetic operator");
  }
}

absl::StatusOr<Value> FloatArith(BinaryOp op, double a, double b) {
  switch (op) {
    case BinaryOp::kAdd:
      return Value::Float(a + b);
    case BinaryOp::kSub:
      return Value::Float(a - b);
    case BinaryOp::kMul:
      return Value::Float(a * b);
    case BinaryOp::kDiv:
      if (b == 0) return ZeroDivision();
      return Value::Float(a / b);
    case BinaryOp::kFloorDiv:
    case BinaryOp::kMod: {
      if (b == 0) return ZeroDivision();
      double mod = std::fmod(a, b);
      double div = (a - mod) / b;
      if (mod != 0) {
        if ((b < 0) != (mod < 0)) {
          mod += b;
          div -= 1.0;
        }
      } else {
        mod = std::copysign(0.0, b);
      }
      if (op == BinaryOp::kMod) return Value::Float(mod);
      double floordiv = std::floor(div);
      if (div - floordiv > 0.5) floordiv += 1.0;
      if (div == 0) floordiv = std::copysign(0.0, a / b);
      return Value::Float(floordiv);
    }
    case BinaryOp::kPow:
      if (a == 0 && b < 0) return ZeroDivision();
      if (a < 0 && b != std::floor(b)) {
        return absl::InvalidArgumentError("negative number raised to a fractional power");
      }
      return Value::Float(std::pow(a, b));
    default:
      return absl::InternalError("not an arithmetic operator");
  }
}

const char* OpText(BinaryOp op) {
  switch (op) {
    case BinaryOp::kAdd:
      return "+";
    case BinaryOp::kSub:
      return "-";
    case BinaryOp::kMul:
      return "*";
    case BinaryOp::kDiv:
      return "/";
    case BinaryOp::kFloorDiv:
      return "//";
    case BinaryOp::kMod:
      return "%";
    case BinaryOp::kPow:
      return "**";
    case BinaryOp::kConcat:
      return "~";
  }
  return "?";
}

// str * n or list * n, bounded before anything is built.
absl::StatusOr<Value> Repeat(const Value& seq, Int n, RenderState& state) {
  if (n < 0) n = 0;
  size_t len = seq.is_string() ? seq.str().size() : seq.list()->items.size();
  size_t limit = seq.is_string() ? state.heap().max_string_bytes()
                                 : state.limits().max_memory_bytes / Heap::kItemBytes;
  if (len > 0 && n > static_cast<Int>(limit / len)) {
    return absl::ResourceExhaustedError(
        absl::StrCat(seq.is_string() ? "string" : "list", " repetition too long"));
  }
  size_t count = len == 0 ? 0 : static_cast<size_t>(n);
  if (seq.is_string()) {
    std::string out;
    out.reserve(len * count);
    for (size_t i = 0; i < count; ++i) out += seq.str();
    return state.heap().NewString(std::move(out));
  }
  const auto& items = seq.list()->items;
  if (auto s = state.heap().CheckItems(len * count); !s.ok()) return s;
  std::vector<Value> out;
  out.reserve(len * count);
  for (size_t i = 0; i < count; ++i) out.insert(out.end(), items.begin(), items.end());
  return state.heap().NewSequence(std::move(out), seq.kind() == ValueKind::kTuple);
}

}  // namespace

bool Truthy(const Value& v) {
  switch (v.kind()) {
    case ValueKind::kUndefined:
    case ValueKind::kNone:
      return false;
    case ValueKind::kBool:
      return v.bool_value();
    case ValueKind::kInt:
      return v.int_value() != 0;
    case ValueKind::kFloat:
      return v.float_value() != 0.0;
    case ValueKind::kString:
      return !v.str().empty();
    case ValueKind::kList:
    case ValueKind::kTuple:
      return !v.list()->items.empty();
    case ValueKind::kDict:
      return v.dict()->size() > 0;
    default:
      return true;
  }
}

bool Equals(const Value& a, const Value& b) { return EqualsAt(a, b, 0); }

absl::StatusOr<int> Compare(const Value& a, const Value& b) { return CompareAt(a, b, 0); }

absl::StatusOr<bool> CompareWith(CompareOp op, const Value& a, const Value& b) {
  switch (op) {
    case CompareOp::kEq:
      return Equals(a, b);
    case CompareOp::kNe:
      return !Equals(a, b);
    case CompareOp::kIn:
      return Contains(b, a);
    case CompareOp::kNotIn: {
      auto in = Contains(b, a);
      if (!in.ok()) return in.status();
      return !*in;
    }
    default:
      break;
  }
  auto c = Compare(a, b);
  if (!c.ok()) return c.status();
  switch (op) {
    case CompareOp::kLt:
      return *c < 0;
    case CompareOp::kLe:
      return *c <= 0;
    case CompareOp::kGt:
      return *c > 0;
    default:
      return *c >= 0;
  }
}

absl::StatusOr<Value> BinaryOperation(BinaryOp op, const Value& a, const Value& b,
                                      RenderState& state) {
  if (op == BinaryOp::kConcat) {
    std::string out;
    if (auto s = AppendStr(a, state.format(), &out); !s.ok()) return s;
    if (auto s = AppendStr(b, state.format(), &out); !s.ok()) return s;
    return state.heap().NewString(std::move(out));
  }
  if (a.is_number() && b.is_number()) {
    if (a.is_integral() && b.is_integral()) return IntArith(op, a.int_value(), b.int_value());
    return FloatArith(op, a.float_value(), b.float_value());
  }
  if (op == BinaryOp::kAdd) {
    if (a.is_string() && b.is_string()) return state.heap().NewString(a.str() + b.str());
    if (a.is_sequence() && a.kind() == b.kind()) {
      size_t n = a.list()->items.size() + b.list()->items.size();
      if (auto s = state.heap().CheckItems(n); !s.ok()) return s;
      std::vector<Value> items = a.list()->items;
      items.insert(items.end(), b.list()->items.begin(), b.list()->items.end());
      return state.heap().NewSequence(std::move(items), a.kind() == ValueKind::kTuple);
    }
  }
  if (op == BinaryOp::kMul) {
    if ((a.is_string() || a.is_sequence()) && b.is_integral()) {
      return Repeat(a, b.int_value(), state);
    }
    if (a.is_integral() && (b.is_string() || b.is_sequence())) {
      return Repeat(b, a.int_value(), state);
    }
  }
  if (op == BinaryOp::kMod && a.is_string()) {
    auto s = PercentFormat(a.str(), b, state);
    if (!s.ok()) return s.status();
    return state.heap().NewString(std::move(*s));
  }
  return TypeError(OpText(op), a, b);
}

absl::StatusOr<Value> UnaryOperation(const Value& v, bool negate) {
  if (v.is_integral()) {
    Int r = v.int_value();
    if (negate && __builtin_sub_overflow(Int(0), r, &r)) return Overflow();
    return Value::Integer(r);
  }
  if (v.is_float()) return Value::Float(negate ? -v.float_value() : v.float_value());
  return absl::InvalidArgumentError(
      absl::StrCat("bad operand type for unary ", negate ? "-" : "+", ": '", TypeName(v), "'"));
}

absl::StatusOr<bool> Contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case ValueKind::kUndefined:
      return false;
    case ValueKind::kString:
      if (!item.is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat("'in <string>' requires string as left operand, not ", TypeName(item)));
      }
      return container.str().find(item.str()) != std::string::npos;
    case ValueKind::kList:
    case ValueKind::kTuple:
      for (const Value& v : container.list()->items) {
        if (Equals(v, item)) return true;
      }
      return false;
    case ValueKind::kDict: {
      auto found = container.dict()->Find(item);
      if (!found.ok()) return found.status();
      return *found != nullptr;
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("argument of type '", TypeName(container), "' is not iterable"));
  }
}

}  // namespace tandem::chat
