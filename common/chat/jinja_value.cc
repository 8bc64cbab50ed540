#include "common/chat/jinja_value.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/chat/jinja_format.h"

namespace tandem::chat {

Value Value::Bool(bool b) {
  Value v(ValueKind::kBool);
  v.u_.b = b;
  return v;
}

Value Value::Integer(Int i) {
  Value v(ValueKind::kInt);
  v.u_.i = i;
  return v;
}

Value Value::Float(double f) {
  Value v(ValueKind::kFloat);
  v.u_.f = f;
  return v;
}

Value Value::String(std::string s) {
  return String(std::make_shared<const std::string>(std::move(s)));
}

Value Value::String(std::shared_ptr<const std::string> s) {
  Value v(ValueKind::kString);
  v.str_ = std::move(s);
  return v;
}

Value Value::ListOf(List* list) {
  Value v(list->is_tuple ? ValueKind::kTuple : ValueKind::kList);
  v.u_.list = list;
  return v;
}

Value Value::DictOf(Dict* dict) {
  Value v(ValueKind::kDict);
  v.u_.dict = dict;
  return v;
}

Value Value::NamespaceOf(Dict* dict) {
  Value v(ValueKind::kNamespace);
  v.u_.dict = dict;
  return v;
}

Value Value::LoopOf(LoopState* loop) {
  Value v(ValueKind::kLoop);
  v.u_.loop = loop;
  return v;
}

Value Value::CallableOf(Callable* fn) {
  Value v(ValueKind::kCallable);
  v.u_.fn = fn;
  return v;
}

double Value::float_value() const {
  switch (kind_) {
    case ValueKind::kFloat:
      return u_.f;
    case ValueKind::kInt:
      return static_cast<double>(u_.i);
    case ValueKind::kBool:
      return u_.b ? 1.0 : 0.0;
    default:
      return 0.0;
  }
}

absl::StatusOr<std::string> HashKey(const Value& key) {
  switch (key.kind()) {
    case ValueKind::kString:
      return absl::StrCat("s", key.str());
    case ValueKind::kNone:
      return std::string("n");
    case ValueKind::kBool:
    case ValueKind::kInt:
      return absl::StrCat("i", IntToString(key.int_value()));
    case ValueKind::kFloat: {
      double f = key.float_value();
      if (std::isfinite(f) && f == std::floor(f) && std::fabs(f) < 1e36) {
        return absl::StrCat("i", IntToString(static_cast<Int>(f)));
      }
      return absl::StrCat("f", FloatRepr(f));
    }
    case ValueKind::kTuple: {
      std::string out = "t(";
      for (const Value& item : key.list()->items) {
        auto part = HashKey(item);
        if (!part.ok()) return part.status();
        absl::StrAppend(&out, part->size(), ":", *part);
      }
      return out;
    }
    default:
      return absl::InvalidArgumentError(absl::StrCat("unhashable type: '", TypeName(key), "'"));
  }
}

absl::StatusOr<const Value*> Dict::Find(const Value& key) const {
  auto hk = HashKey(key);
  if (!hk.ok()) return hk.status();
  auto it = index_.find(*hk);
  if (it == index_.end()) return nullptr;
  return &entries_[it->second].second;
}

const Value* Dict::FindString(std::string_view key) const {
  auto it = index_.find(absl::StrCat("s", std::string(key)));
  return it == index_.end() ? nullptr : &entries_[it->second].second;
}

absl::Status Dict::Set(const Value& key, Value value) {
  auto hk = HashKey(key);
  if (!hk.ok()) return hk.status();
  auto [it, inserted] = index_.try_emplace(*hk, entries_.size());
  if (inserted) {
    entries_.emplace_back(key, std::move(value));
  } else {
    entries_[it->second].second = std::move(value);
  }
  return absl::OkStatus();
}

void Dict::SetString(std::string_view key, Value value) {
  auto [it, inserted] = index_.try_emplace(absl::StrCat("s", std::string(key)), entries_.size());
  if (inserted) {
    entries_.emplace_back(Value::String(std::string(key)), std::move(value));
  } else {
    entries_[it->second].second = std::move(value);
  }
}

absl::StatusOr<bool> Dict::Erase(const Value& key) {
  auto hk = HashKey(key);
  if (!hk.ok()) return hk.status();
  auto it = index_.find(*hk);
  if (it == index_.end()) return false;
  size_t pos = it->second;
  entries_.erase(entries_.begin() + static_cast<std::ptrdiff_t>(pos));
  index_.erase(it);
  for (auto& [k, i] : index_) {
    if (i > pos) --i;
  }
  return true;
}

std::string TypeName(const Value& v) {
  switch (v.kind()) {
    case ValueKind::kUndefined:
      return "Undefined";
    case ValueKind::kNone:
      return "NoneType";
    case ValueKind::kBool:
      return "bool";
    case ValueKind::kInt:
      return "int";
    case ValueKind::kFloat:
      return "float";
    case ValueKind::kString:
      return "str";
    case ValueKind::kList:
      return "list";
    case ValueKind::kTuple:
      return "tuple";
    case ValueKind::kDict:
      return "dict";
    case ValueKind::kNamespace:
      return "Namespace";
    case ValueKind::kLoop:
      return "LoopContext";
    case ValueKind::kCallable:
      return "function";
  }
  return "object";
}

}  // namespace tandem::chat
