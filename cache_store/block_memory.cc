#include "cache_store/block_memory.h"

#include <memory>
#include <optional>
#include <utility>

#include "cache_store/arena_allocator.h"
#include "common/util/status_macros.h"

namespace tandem::cache_store {
namespace {

class HeapBlockMemory final : public BlockMemory {
 public:
  uint8_t* Allocate(int64_t size) override { return std::allocator<uint8_t>().allocate(size); }
  void Free(uint8_t* data, int64_t size) override {
    std::allocator<uint8_t>().deallocate(data, size);
  }
};

class SharedBlockMemory final : public BlockMemory {
 public:
  explicit SharedBlockMemory(std::unique_ptr<ShmArena> arena)
      : arena_(std::move(arena)), allocator_(arena_->data_bytes()) {}

  uint8_t* Allocate(int64_t size) override {
    const std::optional<int64_t> offset = allocator_.Allocate(size);
    return offset ? arena_->data() + *offset : nullptr;
  }
  void Free(uint8_t* data, int64_t size) override { allocator_.Free(data - arena_->data(), size); }
  const ShmArena* arena() const override { return arena_.get(); }

 private:
  std::unique_ptr<ShmArena> arena_;
  ArenaAllocator allocator_;
};

}  // namespace

std::unique_ptr<BlockMemory> NewHeapBlockMemory() { return std::make_unique<HeapBlockMemory>(); }

absl::StatusOr<std::unique_ptr<BlockMemory>> NewSharedBlockMemory(int64_t capacity_bytes,
                                                                  bool preallocate) {
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<ShmArena> arena,
                          ShmArena::Create(capacity_bytes, preallocate));
  return std::make_unique<SharedBlockMemory>(std::move(arena));
}

}  // namespace tandem::cache_store
