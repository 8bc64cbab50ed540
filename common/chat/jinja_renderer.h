// Executes a template's statements into the output, within the render's limits. Errors carry
// "<name> line N: " (except the template's own raise_exception messages, kept as they are).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "common/chat/jinja_ast.h"
#include "common/chat/jinja_eval.h"
#include "common/chat/jinja_scope.h"
#include "common/chat/render_state.h"

namespace tandem::chat {

class Renderer : public MacroInvoker {
 public:
  Renderer(const std::string& name, RenderState& state)
      : name_(name), state_(state), eval_(state, *this) {}

  // Renders `body` with `root` as the outermost scope.
  absl::StatusOr<std::string> Render(const StmtList& body, Scope& root);

  absl::StatusOr<Value> InvokeMacro(const Callable& fn, const CallArgs& args,
                                    const Value& caller) override;

 private:
  enum class Flow { kNormal, kBreak, kContinue };

  absl::StatusOr<Flow> ExecBody(const StmtList& body, Scope& scope);
  absl::StatusOr<Flow> Exec(const Stmt& stmt, Scope& scope);
  absl::StatusOr<Flow> ExecFor(const Stmt& stmt, Scope& scope);
  absl::StatusOr<Flow> ExecIf(const Stmt& stmt, Scope& scope);
  absl::Status ExecSet(const Stmt& stmt, Scope& scope);
  absl::Status ExecBlock(const Stmt& stmt, Scope& scope);
  absl::Status ExecCallBlock(const Stmt& stmt, Scope& scope);
  absl::Status Assign(const Target& target, const Value& value, Scope& scope);
  absl::Status BindParams(const Stmt& def, const std::string& name, const CallArgs& args,
                          Scope& scope);
  // Renders `body` into a string of its own.
  absl::StatusOr<std::string> Capture(const StmtList& body, Scope& scope);
  absl::Status Emit(const Value& v);
  absl::Status EmitText(const std::string& text);
  // Prefixes "<name> line N: " once.
  absl::Status Annotate(absl::Status status, int line) const;

  const std::string& name_;
  RenderState& state_;
  Evaluator eval_;
  Scope* root_ = nullptr;
  std::string* out_ = nullptr;
};

}  // namespace tandem::chat
