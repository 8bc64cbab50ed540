// The signatures of Jinja's built-in filters, tests, value methods and global functions, and
// the lookups the parser uses to reject unknown filters and tests when a template loads.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/chat/jinja_value.h"

namespace tandem::chat {

class RenderState;

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

using FilterFn = absl::StatusOr<Value> (*)(const Value& input, const CallArgs& args,
                                           RenderState& state);
using TestFn = absl::StatusOr<bool> (*)(const Value& input, const CallArgs& args,
                                        RenderState& state);

// nullptr when Jinja has no such filter or test (or Tandem does not implement it).
FilterFn FindFilter(std::string_view name);
TestFn FindTest(std::string_view name);

// Binds `args` to the parameters `names` of `fn` (Python rules: positional first, then by
// keyword). Missing parameters are nullopt; more than `names` or an unknown keyword is an error.
absl::StatusOr<std::vector<std::optional<Value>>> BindArgs(
    std::string_view fn, const CallArgs& args, const std::vector<std::string_view>& names,
    size_t required = 0);

// Methods of str, list, dict and loop values ("a b".split(), d.items(), loop.cycle(...)).
bool HasMethod(const Value& receiver, std::string_view name);
absl::StatusOr<Value> CallMethod(const Value& receiver, std::string_view name, const CallArgs& args,
                                 RenderState& state);

// Global functions: range, namespace, dict, raise_exception, strftime_now.
bool IsGlobalFunction(std::string_view name);
absl::StatusOr<Value> CallGlobal(std::string_view name, const CallArgs& args, RenderState& state);

// Status code that marks an error raised by the template itself (raise_exception): its
// message is the template's, shown as it is.
absl::Status TemplateRaised(std::string message);
bool IsTemplateRaised(const absl::Status& status);

}  // namespace tandem::chat
