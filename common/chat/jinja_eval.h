// Evaluates expressions against a scope. Macro bodies are statements, so calling a macro goes
// back to the renderer through the MacroInvoker seam.
#pragma once

#include <string>
#include <string_view>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/chat/jinja_ast.h"
#include "common/chat/jinja_builtins.h"
#include "common/chat/jinja_scope.h"
#include "common/chat/render_state.h"

namespace tandem::chat {

class MacroInvoker {
 public:
  virtual ~MacroInvoker() = default;
  // Runs a kMacro or kCaller callable; `caller` is a {% call %} body, or undefined.
  virtual absl::StatusOr<Value> InvokeMacro(const Callable& fn, const CallArgs& args,
                                            const Value& caller) = 0;
};

class Evaluator {
 public:
  Evaluator(RenderState& state, MacroInvoker& macros) : state_(state), macros_(macros) {}

  absl::StatusOr<Value> Eval(const Expr& e, const Scope& scope);
  // Applies a filter chain whose innermost input is null (filter blocks, `set x | f`).
  absl::StatusOr<Value> ApplyFilterChain(const Expr& chain, const Value& input, const Scope& scope);
  // Arguments e.args[first:] and e.kwargs.
  absl::StatusOr<CallArgs> EvalArgs(const Expr& e, size_t first, const Scope& scope);
  // Calls `callee`; `undefined_error` is the message when it is undefined.
  absl::StatusOr<Value> Call(const Value& callee, const CallArgs& args, const Value& caller,
                             std::string_view undefined_error);
  // The callee of a call expression and the message for when it is undefined.
  absl::StatusOr<Value> EvalCallee(const Expr& callee, const Scope& scope, std::string* what);

 private:
  absl::StatusOr<Value> EvalInner(const Expr& e, const Scope& scope);
  absl::StatusOr<Value> EvalName(const Expr& e, const Scope& scope);
  absl::StatusOr<Value> EvalContainer(const Expr& e, const Scope& scope);
  absl::StatusOr<Value> EvalCompare(const Expr& e, const Scope& scope);
  absl::StatusOr<Value> EvalLogic(const Expr& e, const Scope& scope);
  absl::StatusOr<Value> EvalAccess(const Expr& e, const Scope& scope);
  absl::StatusOr<Value> EvalCall(const Expr& e, const Scope& scope);
  absl::StatusOr<Value> EvalFilterOrTest(const Expr& e, const Scope& scope);

  RenderState& state_;
  MacroInvoker& macros_;
  absl::flat_hash_map<std::string, Value> globals_;  // global functions, made on first use
};

}  // namespace tandem::chat
