// Jinja's built-in filters on sequences and mappings (length, join, map, select, sort, ...).
#pragma once

#include "absl/status/statusor.h"
#include "common/chat/jinja_builtins.h"
#include "common/chat/render_state.h"

namespace tandem::chat {

#define TANDEM_CHAT_FILTER(name) \
  absl::StatusOr<Value> name(const Value& v, const CallArgs& args, RenderState& state)

TANDEM_CHAT_FILTER(FilterBatch);
TANDEM_CHAT_FILTER(FilterDictSort);
TANDEM_CHAT_FILTER(FilterFirst);
TANDEM_CHAT_FILTER(FilterItems);
TANDEM_CHAT_FILTER(FilterJoin);
TANDEM_CHAT_FILTER(FilterLast);
TANDEM_CHAT_FILTER(FilterLength);
TANDEM_CHAT_FILTER(FilterList);
TANDEM_CHAT_FILTER(FilterMap);
TANDEM_CHAT_FILTER(FilterMax);
TANDEM_CHAT_FILTER(FilterMin);
TANDEM_CHAT_FILTER(FilterReject);
TANDEM_CHAT_FILTER(FilterRejectAttr);
TANDEM_CHAT_FILTER(FilterReverse);
TANDEM_CHAT_FILTER(FilterSelect);
TANDEM_CHAT_FILTER(FilterSelectAttr);
TANDEM_CHAT_FILTER(FilterSort);
TANDEM_CHAT_FILTER(FilterSum);
TANDEM_CHAT_FILTER(FilterUnique);

#undef TANDEM_CHAT_FILTER

}  // namespace tandem::chat
