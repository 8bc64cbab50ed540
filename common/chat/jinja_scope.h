// Variable scopes. The root holds the render context and top-level `set`s; each for-loop
// iteration and macro call gets a child, so a `set` inside a loop does not leak out of it
// (Jinja's rule, which is why templates carry state across iterations in a namespace()).
#pragma once

#include <string>
#include <string_view>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "common/chat/jinja_value.h"

namespace tandem::chat {

class Scope {
 public:
  explicit Scope(const Scope* parent) : parent_(parent) {}
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

  // The innermost binding of `name`, or nullptr.
  const Value* Find(std::string_view name) const {
    for (const Scope* s = this; s != nullptr; s = s->parent_) {
      auto it = s->vars_.find(absl::string_view(name.data(), name.size()));
      if (it != s->vars_.end()) return &it->second;
    }
    return nullptr;
  }
  void Set(std::string_view name, Value value) { vars_[std::string(name)] = std::move(value); }

 private:
  const Scope* parent_;
  absl::flat_hash_map<std::string, Value> vars_;
};

}  // namespace tandem::chat
