#include "common/kv/block_pool.h"

#include <sys/mman.h>

#include <cassert>
#include <limits>
#include <tuple>

#include "absl/strings/str_cat.h"

namespace tandem::kv {
namespace {

absl::Status CheckRange(const char* field, int value, int max) {
  if (value <= 0 || value > max) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV layout: ", field, " = ", value, " must be in [1, ", max, "]"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateKvLayout(const KvLayout& layout) {
  for (auto [field, value, max] : {std::tuple{"num_layers", layout.num_layers, kMaxLayers},
                                   std::tuple{"num_kv_heads", layout.num_kv_heads, kMaxKvHeads},
                                   std::tuple{"head_dim", layout.head_dim, kMaxHeadDim},
                                   std::tuple{"block_size", layout.block_size, kMaxBlockSize}}) {
    absl::Status s = CheckRange(field, value, max);
    if (!s.ok()) return s;
  }
  if (static_cast<uint8_t>(layout.dtype) > static_cast<uint8_t>(DType::kI8)) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV layout: unknown dtype ", static_cast<int>(layout.dtype)));
  }
  // Each factor is < 2^17, so the product below (< 2^62) cannot overflow.
  if (layout.BlockBytes() > kMaxBlockBytes) {
    return absl::InvalidArgumentError(absl::StrCat("KV layout: block of ", layout.BlockBytes(),
                                                   " bytes exceeds the limit of ", kMaxBlockBytes));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<BlockPool>> BlockPool::Create(const KvLayout& layout,
                                                             int64_t num_blocks) {
  absl::Status s = ValidateKvLayout(layout);
  if (!s.ok()) return s;
  if (num_blocks <= 0 || num_blocks > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cache: num_blocks = ", num_blocks, " must be in [1, 2^31)"));
  }
  const size_t block_bytes = layout.BlockBytes();
  if (static_cast<size_t>(num_blocks) > kMaxPoolBytes / block_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("KV cache: ", num_blocks, " blocks of ",
                                                   block_bytes, " bytes exceed the limit of ",
                                                   kMaxPoolBytes, " bytes"));
  }
  const size_t bytes = static_cast<size_t>(num_blocks) * block_bytes;
  // An anonymous mapping is page-aligned (>= 64) and zero-filled lazily by the kernel on first
  // touch, so a large pool costs nothing until used.
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("KV cache: cannot map ", bytes, " bytes for ", num_blocks, " blocks"));
  }
  return std::unique_ptr<BlockPool>(
      new BlockPool(layout, num_blocks, static_cast<uint8_t*>(p), bytes));
}

BlockPool::BlockPool(const KvLayout& layout, int64_t num_blocks, uint8_t* base, size_t mapped_bytes)
    : layout_(layout),
      block_bytes_(layout.BlockBytes()),
      base_(base),
      mapped_bytes_(mapped_bytes),
      blocks_(num_blocks) {
  free_list_.reserve(num_blocks);
  // Reverse order so block 0 is handed out first (deterministic, friendly to tests and debugging).
  for (int64_t id = num_blocks - 1; id >= 0; --id) free_list_.push_back(static_cast<int32_t>(id));
}

BlockPool::~BlockPool() { munmap(base_, mapped_bytes_); }

int32_t BlockPool::Allocate(bool* evicted, BlockHash* evicted_hash) {
  *evicted = false;
  int32_t id = kNoBlock;
  if (!free_list_.empty()) {
    id = free_list_.back();
    free_list_.pop_back();
  } else if (lru_head_ != kNoBlock) {
    id = lru_head_;
    *evicted_hash = DropCached(id);
    *evicted = true;
    free_list_.pop_back();  // DropCached pushed it onto the free list
  } else {
    return kNoBlock;
  }
  KvBlock& b = blocks_[id];
  assert(b.ref_count == 0 && !b.indexed);
  b.ref_count = 1;
  ++num_used_;
  return id;
}

void BlockPool::Acquire(int32_t id) {
  KvBlock& b = blocks_[id];
  if (b.ref_count == 0) {
    assert(b.indexed);  // only cached blocks are acquired at refcount 0
    LruUnlink(id);
    ++num_used_;
  }
  ++b.ref_count;
}

void BlockPool::Release(int32_t id) {
  KvBlock& b = blocks_[id];
  assert(b.ref_count > 0);
  if (--b.ref_count > 0) return;
  --num_used_;
  if (b.indexed) {
    LruPushBack(id);
  } else {
    free_list_.push_back(id);
  }
}

void BlockPool::SetIndexed(int32_t id, BlockHash hash) {
  KvBlock& b = blocks_[id];
  assert(b.ref_count > 0 && !b.indexed);
  b.indexed = true;
  b.hash = hash;
}

BlockHash BlockPool::DropCached(int32_t id) {
  KvBlock& b = blocks_[id];
  assert(b.ref_count == 0 && b.indexed);
  LruUnlink(id);
  b.indexed = false;
  free_list_.push_back(id);
  return b.hash;
}

void BlockPool::LruUnlink(int32_t id) {
  KvBlock& b = blocks_[id];
  if (b.lru_prev != kNoBlock) {
    blocks_[b.lru_prev].lru_next = b.lru_next;
  } else {
    lru_head_ = b.lru_next;
  }
  if (b.lru_next != kNoBlock) {
    blocks_[b.lru_next].lru_prev = b.lru_prev;
  } else {
    lru_tail_ = b.lru_prev;
  }
  b.lru_prev = b.lru_next = kNoBlock;
  --lru_size_;
}

void BlockPool::LruPushBack(int32_t id) {
  KvBlock& b = blocks_[id];
  b.lru_prev = lru_tail_;
  b.lru_next = kNoBlock;
  if (lru_tail_ != kNoBlock) {
    blocks_[lru_tail_].lru_next = id;
  } else {
    lru_head_ = id;
  }
  lru_tail_ = id;
  ++lru_size_;
}

}  // namespace tandem::kv
