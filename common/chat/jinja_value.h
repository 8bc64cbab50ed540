// The values a chat template computes with: Python's object model as far as Jinja templates
// see it (None, bool, int, float, str, list, tuple, dict, Jinja's Undefined and Namespace,
// callables). Containers live in a per-render Heap and are shared by pointer, so mutation
// through one name is seen through every other (Python reference semantics) and reference
// cycles (`xs.append(xs)`) cannot leak: everything is freed when the render ends.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem::chat {

// Python ints are unbounded; 128 bits hold every JSON integer exactly and overflow is an error.
using Int = __int128;

class Value;
class Dict;
struct List;
struct Callable;
struct LoopState;

enum class ValueKind : uint8_t {
  kUndefined,
  kNone,
  kBool,
  kInt,
  kFloat,
  kString,
  kList,
  kTuple,
  kDict,
  kNamespace,  // Jinja's namespace(): attributes assignable with `set ns.x = ...`
  kLoop,       // the `loop` variable of a for loop
  kCallable,   // macro, global function, bound method
};

class Value {
 public:
  Value() : kind_(ValueKind::kUndefined) { u_.i = 0; }

  static Value None() { return Value(ValueKind::kNone); }
  static Value Bool(bool b);
  static Value Integer(Int i);
  static Value Float(double f);
  static Value String(std::string s);
  static Value String(std::shared_ptr<const std::string> s);
  static Value ListOf(List* list);  // kList or kTuple, from list->is_tuple
  static Value DictOf(Dict* dict);
  static Value NamespaceOf(Dict* dict);
  static Value LoopOf(LoopState* loop);
  static Value CallableOf(Callable* fn);

  ValueKind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == ValueKind::kUndefined; }
  bool is_none() const { return kind_ == ValueKind::kNone; }
  bool is_bool() const { return kind_ == ValueKind::kBool; }
  bool is_int() const { return kind_ == ValueKind::kInt; }
  bool is_float() const { return kind_ == ValueKind::kFloat; }
  bool is_string() const { return kind_ == ValueKind::kString; }
  // list or tuple
  bool is_sequence() const { return kind_ == ValueKind::kList || kind_ == ValueKind::kTuple; }
  bool is_dict() const { return kind_ == ValueKind::kDict; }
  bool is_namespace() const { return kind_ == ValueKind::kNamespace; }
  bool is_callable() const { return kind_ == ValueKind::kCallable; }
  // int, float or bool (Python's bool is an int)
  bool is_number() const {
    return kind_ == ValueKind::kInt || kind_ == ValueKind::kFloat || kind_ == ValueKind::kBool;
  }
  // int or bool
  bool is_integral() const { return kind_ == ValueKind::kInt || kind_ == ValueKind::kBool; }

  bool bool_value() const { return u_.b; }
  // For kInt and kBool.
  Int int_value() const { return kind_ == ValueKind::kBool ? Int(u_.b) : u_.i; }
  // For any number.
  double float_value() const;
  const std::string& str() const { return *str_; }
  const std::shared_ptr<const std::string>& shared_str() const { return str_; }
  List* list() const { return u_.list; }
  Dict* dict() const { return u_.dict; }  // kDict and kNamespace
  LoopState* loop() const { return u_.loop; }
  Callable* callable() const { return u_.fn; }

 private:
  explicit Value(ValueKind kind) : kind_(kind) { u_.i = 0; }

  ValueKind kind_;
  union {
    bool b;
    Int i;
    double f;
    List* list;
    Dict* dict;
    LoopState* loop;
    Callable* fn;
  } u_;
  std::shared_ptr<const std::string> str_;
};

struct List {
  std::vector<Value> items;
  bool is_tuple = false;
};

// An insertion-ordered dict keyed by hashable values (str, int, float, bool, None, tuple).
class Dict {
 public:
  size_t size() const { return entries_.size(); }
  const std::vector<std::pair<Value, Value>>& entries() const { return entries_; }
  // nullptr when absent; InvalidArgument only for an unhashable key.
  absl::StatusOr<const Value*> Find(const Value& key) const;
  const Value* FindString(std::string_view key) const;
  absl::Status Set(const Value& key, Value value);
  void SetString(std::string_view key, Value value);
  // Removes the key; false when absent.
  absl::StatusOr<bool> Erase(const Value& key);

 private:
  std::vector<std::pair<Value, Value>> entries_;
  absl::flat_hash_map<std::string, size_t> index_;
};

// The hash-map key of a dict key: equal Python keys (1, 1.0, True) give equal strings.
absl::StatusOr<std::string> HashKey(const Value& key);

// Python's type name, for error messages ("str", "list", "NoneType", ...).
std::string TypeName(const Value& v);

}  // namespace tandem::chat
