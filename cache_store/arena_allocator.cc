#include "cache_store/arena_allocator.h"

#include "common/util/check.h"

namespace tandem::cache_store {

ArenaAllocator::ArenaAllocator(int64_t size, int64_t alignment)
    : alignment_(alignment), size_(size / alignment * alignment), free_bytes_(0) {
  TANDEM_CHECK(alignment > 0 && (alignment & (alignment - 1)) == 0, "alignment not a power of 2");
  if (size_ > 0) AddFree(0, size_);
}

void ArenaAllocator::AddFree(int64_t offset, int64_t length) {
  by_offset_.emplace(offset, length);
  by_length_.emplace(length, offset);
  free_bytes_ += length;
}

void ArenaAllocator::RemoveFree(std::map<int64_t, int64_t>::iterator it) {
  by_length_.erase({it->second, it->first});
  free_bytes_ -= it->second;
  by_offset_.erase(it);
}

std::optional<int64_t> ArenaAllocator::Allocate(int64_t size) {
  TANDEM_CHECK(size > 0, "allocating nothing");
  const int64_t need = Rounded(size);
  auto best = by_length_.lower_bound({need, 0});
  if (best == by_length_.end()) return std::nullopt;
  const auto [length, offset] = *best;
  RemoveFree(by_offset_.find(offset));
  if (length > need) AddFree(offset + need, length - need);
  return offset;
}

bool ArenaAllocator::AllocateAt(int64_t offset, int64_t size) {
  TANDEM_CHECK(size > 0 && offset >= 0 && offset % alignment_ == 0, "allocating a bad range");
  const int64_t need = Rounded(size);
  auto it = by_offset_.upper_bound(offset);
  if (it == by_offset_.begin()) return false;
  --it;  // the free range starting at or before `offset`
  const auto [start, length] = *it;
  if (start + length < offset + need) return false;
  RemoveFree(it);
  if (offset > start) AddFree(start, offset - start);
  if (start + length > offset + need) AddFree(offset + need, start + length - offset - need);
  return true;
}

void ArenaAllocator::Free(int64_t offset, int64_t size) {
  int64_t start = offset;
  int64_t length = Rounded(size);
  TANDEM_CHECK(start >= 0 && start + length <= size_, "freeing outside the arena");
  auto next = by_offset_.lower_bound(start);
  TANDEM_CHECK(next == by_offset_.end() || next->first >= start + length, "freeing free space");
  if (next != by_offset_.end() && next->first == start + length) {
    length += next->second;
    auto after = std::next(next);
    RemoveFree(next);
    next = after;
  }
  if (next != by_offset_.begin()) {
    auto prev = std::prev(next);
    TANDEM_CHECK(prev->first + prev->second <= start, "freeing free space");
    if (prev->first + prev->second == start) {
      start = prev->first;
      length += prev->second;
      RemoveFree(prev);
    }
  }
  AddFree(start, length);
}

int64_t ArenaAllocator::largest_free_range() const {
  return by_length_.empty() ? 0 : by_length_.rbegin()->first;
}

}  // namespace tandem::cache_store
