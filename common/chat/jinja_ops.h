// Python's operators on template values: truthiness, ==, ordering, arithmetic (int/float
// rules, floor division and modulo signs, overflow is an error), `~`, `in`.
#pragma once

#include "absl/status/statusor.h"
#include "common/chat/jinja_ast.h"
#include "common/chat/jinja_value.h"
#include "common/chat/render_state.h"

namespace tandem::chat {

bool Truthy(const Value& v);
// Python ==: 1 == 1.0 == True, containers by content (dicts ignoring order).
bool Equals(const Value& a, const Value& b);
// Python ordering: negative, zero or positive; TypeError (InvalidArgument) between unorderable
// types ('<' between str and int).
absl::StatusOr<int> Compare(const Value& a, const Value& b);
absl::StatusOr<bool> CompareWith(CompareOp op, const Value& a, const Value& b);
absl::StatusOr<Value> BinaryOperation(BinaryOp op, const Value& a, const Value& b,
                                      RenderState& state);
// Unary minus (negate) or plus.
absl::StatusOr<Value> UnaryOperation(const Value& v, bool negate);
// `item in container`.
absl::StatusOr<bool> Contains(const Value& container, const Value& item);

}  // namespace tandem::chat
