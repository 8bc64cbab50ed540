// Python's two string formatting languages, as templates reach them: `fmt % args` (and the
// `format` filter) and str.format() with {} fields and format specs.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "common/chat/jinja_builtins.h"
#include "common/chat/jinja_value.h"
#include "common/chat/render_state.h"

namespace tandem::chat {

// printf style: %s %r %a %d %i %u %x %X %o %e %E %f %F %g %G %c %%, flags "-+ #0", width,
// precision, %(key)s with a dict. `args` is a tuple of values, a dict, or one value.
absl::StatusOr<std::string> PercentFormat(const std::string& fmt, const Value& args,
                                          RenderState& state);

// str.format: {} {0} {name} with !r/!s conversions and [[fill]align][sign][#][0][width]
// [,][.precision][type] specs.
absl::StatusOr<std::string> BraceFormat(const std::string& fmt, const CallArgs& args,
                                        RenderState& state);

}  // namespace tandem::chat
