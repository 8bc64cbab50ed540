// Per-render ownership of every container a template creates, with a byte budget so that no
// template can grow memory without bound (`{% for ... %}{% set _ = xs.append(xs * 2) %}`).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/chat/jinja_value.h"

namespace tandem::chat {

struct Stmt;
class Scope;

// The state of one `for` loop, read through the `loop` variable.
struct LoopState {
  std::vector<Value> items;  // the (filtered) items, snapshotted when the loop starts
  size_t index0 = 0;
  bool has_changed_value = false;  // loop.changed() has been called
  Value changed_value;
};

struct Callable {
  enum class Type {
    kGlobal,  // range, namespace, dict, raise_exception, strftime_now
    kMethod,  // receiver.name(...), e.g. "abc".upper
    kMacro,   // {% macro %}
    kCaller,  // the body of a {% call %} block, passed to the macro as `caller`
  };
  Type type = Type::kGlobal;
  std::string name;
  Value receiver;                  // kMethod
  const Stmt* def = nullptr;       // kMacro, kCaller: parameters and body
  const Scope* closure = nullptr;  // kCaller: the call block's scope, valid while `live`
  bool live = true;
};

class Heap {
 public:
  // `max_bytes` bounds everything charged over the render; `max_string_bytes` any one string.
  Heap(size_t max_bytes, size_t max_string_bytes)
      : max_bytes_(max_bytes), max_string_bytes_(max_string_bytes) {}
  Heap(const Heap&) = delete;
  Heap& operator=(const Heap&) = delete;

  absl::StatusOr<List*> NewList(bool tuple = false);
  absl::StatusOr<Dict*> NewDict();
  absl::StatusOr<LoopState*> NewLoop();
  absl::StatusOr<Callable*> NewCallable();

  // A string value, charged to the budget; ResourceExhausted past max_string_bytes.
  absl::StatusOr<Value> NewString(std::string s);
  // A new list or tuple holding `items`.
  absl::StatusOr<Value> NewSequence(std::vector<Value> items, bool tuple = false);

  // Charges `bytes`; ResourceExhausted once the budget is spent.
  absl::Status Charge(size_t bytes);
  // Charges `n` container elements.
  absl::Status ChargeItems(size_t n) { return Charge(n * kItemBytes); }
  // ResourceExhausted, charging nothing, when `n` more elements would not fit: checked before
  // building a large container, which NewSequence then charges.
  absl::Status CheckItems(size_t n) const;
  size_t max_string_bytes() const { return max_string_bytes_; }

  static constexpr size_t kItemBytes = sizeof(Value) * 2;

 private:
  size_t max_bytes_;
  size_t max_string_bytes_;
  size_t used_ = 0;
  std::vector<std::unique_ptr<List>> lists_;
  std::vector<std::unique_ptr<Dict>> dicts_;
  std::vector<std::unique_ptr<LoopState>> loops_;
  std::vector<std::unique_ptr<Callable>> callables_;
};

}  // namespace tandem::chat
