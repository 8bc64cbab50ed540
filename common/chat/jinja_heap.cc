#include "common/chat/jinja_heap.h"

#include "absl/strings/str_cat.h"

namespace tandem::chat {
namespace {
constexpr size_t kObjectBytes = 64;
}  // namespace

absl::Status Heap::Charge(size_t bytes) {
  if (bytes > max_bytes_ - used_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("template used more than ", max_bytes_, " bytes of memory"));
  }
  used_ += bytes;
  return absl::OkStatus();
}

absl::Status Heap::CheckItems(size_t n) const {
  if (n > (max_bytes_ - used_) / kItemBytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("template used more than ", max_bytes_, " bytes of memory"));
  }
  return absl::OkStatus();
}

absl::StatusOr<List*> Heap::NewList(bool tuple) {
  if (auto s = Charge(kObjectBytes); !s.ok()) return s;
  lists_.push_back(std::make_unique<List>());
  lists_.back()->is_tuple = tuple;
  return lists_.back().get();
}

absl::StatusOr<Dict*> Heap::NewDict() {
  if (auto s = Charge(kObjectBytes); !s.ok()) return s;
  dicts_.push_back(std::make_unique<Dict>());
  return dicts_.back().get();
}

absl::StatusOr<LoopState*> Heap::NewLoop() {
  if (auto s = Charge(kObjectBytes); !s.ok()) return s;
  loops_.push_back(std::make_unique<LoopState>());
  return loops_.back().get();
}

absl::StatusOr<Callable*> Heap::NewCallable() {
  if (auto s = Charge(kObjectBytes); !s.ok()) return s;
  callables_.push_back(std::make_unique<Callable>());
  return callables_.back().get();
}

absl::StatusOr<Value> Heap::NewString(std::string s) {
  if (s.size() > max_string_bytes_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("template built a string longer than ", max_string_bytes_, " bytes"));
  }
  if (auto st = Charge(s.size() + kObjectBytes); !st.ok()) return st;
  return Value::String(std::move(s));
}

absl::StatusOr<Value> Heap::NewSequence(std::vector<Value> items, bool tuple) {
  if (auto s = ChargeItems(items.size()); !s.ok()) return s;
  auto list = NewList(tuple);
  if (!list.ok()) return list.status();
  (*list)->items = std::move(items);
  return Value::ListOf(*list);
}

}  // namespace tandem::chat
