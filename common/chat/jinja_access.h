// Reading into values as Jinja does: x.attr and x[key] (a missing attribute, key or index is
// undefined, never an error), slices, len(), and iteration.
#pragma once

#include <optional>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/chat/jinja_value.h"
#include "common/chat/render_state.h"

namespace tandem::chat {

// obj.name: a dict's methods, else its key; a namespace's attribute; loop.index etc.;
// str and list methods as bound callables. Undefined when there is none.
absl::StatusOr<Value> GetAttr(const Value& obj, std::string_view name, RenderState& state);
// obj[key]: dict key, list/str index (negative counts from the end), else obj.key.
absl::StatusOr<Value> GetItem(const Value& obj, const Value& key, RenderState& state);
// obj[start:stop:step] on str, list and tuple; an unset or None bound is omitted.
absl::StatusOr<Value> Slice(const Value& obj, const Value& start, const Value& stop,
                            const Value& step, RenderState& state);
// len(v): code points of a str, items of a container; 0 for undefined.
absl::StatusOr<size_t> Length(const Value& v);
// The items `for x in v` visits: list items, dict keys, str characters; none for undefined.
absl::StatusOr<std::vector<Value>> Iterate(const Value& v, RenderState& state);
// Jinja's attribute getter for filters (sort(attribute='a.b'), map(attribute=...)): dotted
// path, integer parts index lists.
absl::StatusOr<Value> GetPath(const Value& obj, std::string_view path, RenderState& state);

}  // namespace tandem::chat
