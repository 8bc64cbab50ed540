// Methods of list, tuple, dict and loop values; str methods are in jinja_methods.cc.
#pragma once

#include <string_view>

#include "absl/status/statusor.h"
#include "common/chat/jinja_builtins.h"
#include "common/chat/render_state.h"

namespace tandem::chat {

absl::StatusOr<Value> ListMethod(const Value& list, std::string_view name, const CallArgs& args,
                                 RenderState& state);
absl::StatusOr<Value> DictMethod(const Value& dict, std::string_view name, const CallArgs& args,
                                 RenderState& state);
absl::StatusOr<Value> LoopMethod(const Value& loop, std::string_view name, const CallArgs& args,
                                 RenderState& state);

}  // namespace tandem::chat
