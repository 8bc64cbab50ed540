#include "common/kv/block_pool.h"

#include <algorithm>
#include <limits>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "common/util/check.h"

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
                                                             int64_t num_blocks, int64_t num_narrow,
                                                             BlockMemory* memory) {
  absl::Status s = ValidateKvLayout(layout);
  if (!s.ok()) return s;
  const int64_t total = num_blocks + std::max<int64_t>(num_narrow, 0);
  if (num_blocks < 0 || num_narrow < 0 || total <= 0 ||
      total > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat("KV cache: num_blocks = ", num_blocks, " + ",
                                                   num_narrow, " must be in [1, 2^31)"));
  }
  KvArena arena{.layout = layout, .num_wide = num_blocks, .narrow = layout};
  arena.narrow.dtype = DType::kI8;
  const size_t wide_bytes = layout.BlockBytes();
  const size_t narrow_bytes = arena.narrow.BlockBytes();
  if (static_cast<size_t>(num_blocks) > kMaxPoolBytes / wide_bytes ||
      static_cast<size_t>(num_narrow) > kMaxPoolBytes / narrow_bytes ||
      num_blocks * wide_bytes + num_narrow * narrow_bytes > kMaxPoolBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cache: ", num_blocks, " blocks of ", wide_bytes, " bytes and ", num_narrow,
                     " of ", narrow_bytes, " exceed the limit of ", kMaxPoolBytes, " bytes"));
  }
  const size_t bytes = num_blocks * wide_bytes + num_narrow * narrow_bytes;
  if (memory == nullptr) memory = &HostBlockMemory();
  absl::StatusOr<uint8_t*> p = memory->Map(bytes);
  if (!p.ok()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("KV cache: ", total, " blocks: ", p.status().message()));
  }
  arena.base = *p;
  return std::unique_ptr<BlockPool>(new BlockPool(arena, total, bytes, *memory));
}

BlockPool::BlockPool(const KvArena& arena, int64_t num_blocks, size_t mapped_bytes,
                     BlockMemory& memory)
    : arena_(arena), mapped_bytes_(mapped_bytes), memory_(memory), blocks_(num_blocks) {
  // Reverse order so block 0 is handed out first (deterministic, friendly to tests and debugging).
  for (int64_t id = num_blocks - 1; id >= 0; --id) {
    FreeListOf(static_cast<int32_t>(id)).push_back(static_cast<int32_t>(id));
  }
}

BlockPool::~BlockPool() { memory_.Unmap(arena_.base, mapped_bytes_); }

int32_t BlockPool::Take(BlockKind kind, bool* evicted, BlockHash* evicted_hash) {
  std::vector<int32_t>& free_list = free_lists_[static_cast<int>(kind)];
  const int32_t oldest = lru_[static_cast<int>(kind)].head;
  if (free_list.empty() && oldest != kNoBlock) {
    *evicted_hash = DropCached(oldest);  // pushes it onto the free list
    *evicted = true;
  }
  if (free_list.empty()) return kNoBlock;
  const int32_t id = free_list.back();
  free_list.pop_back();
  return id;
}

int32_t BlockPool::Allocate(bool* evicted, BlockHash* evicted_hash, BlockKind kind,
                            bool only_kind) {
  *evicted = false;
  int32_t id = Take(kind, evicted, evicted_hash);
  if (id == kNoBlock && !only_kind) {
    id = Take(kind == BlockKind::kWide ? BlockKind::kNarrow : BlockKind::kWide, evicted,
              evicted_hash);
  }
  if (id == kNoBlock) return kNoBlock;
  KvBlock& b = blocks_[id];
  TANDEM_CHECK(b.ref_count == 0 && !b.indexed, "a free block in use");
  b.ref_count = 1;
  ++num_used_;
  return id;
}

void BlockPool::Acquire(int32_t id) {
  KvBlock& b = blocks_[id];
  if (b.ref_count == 0) {
    TANDEM_CHECK(b.indexed, "acquiring a free block (only cached ones have refcount 0)");
    LruUnlink(id);
    ++num_used_;
  }
  ++b.ref_count;
}

void BlockPool::Release(int32_t id) {
  KvBlock& b = blocks_[id];
  TANDEM_CHECK(b.ref_count > 0, "releasing a block nobody holds");
  if (--b.ref_count > 0) return;
  --num_used_;
  if (b.indexed) {
    LruPushBack(id);
  } else {
    FreeListOf(id).push_back(id);
  }
}

void BlockPool::SetIndexed(int32_t id, BlockHash hash) {
  KvBlock& b = blocks_[id];
  TANDEM_CHECK(b.ref_count > 0 && !b.indexed, "indexing a block not held, or twice");
  b.indexed = true;
  b.hash = hash;
}

void BlockPool::ClearIndexed(int32_t id) {
  KvBlock& b = blocks_[id];
  TANDEM_CHECK(b.ref_count > 0 && b.indexed, "unindexing a block not held or not indexed");
  b.indexed = false;
}

BlockHash BlockPool::DropCached(int32_t id) {
  KvBlock& b = blocks_[id];
  TANDEM_CHECK(b.ref_count == 0 && b.indexed, "dropping a cached block still in use");
  LruUnlink(id);
  b.indexed = false;
  FreeListOf(id).push_back(id);
  return b.hash;
}

void BlockPool::LruUnlink(int32_t id) {
  KvBlock& b = blocks_[id];
  Lru& lru = LruOf(id);
  if (b.lru_prev != kNoBlock) {
    blocks_[b.lru_prev].lru_next = b.lru_next;
  } else {
    lru.head = b.lru_next;
  }
  if (b.lru_next != kNoBlock) {
    blocks_[b.lru_next].lru_prev = b.lru_prev;
  } else {
    lru.tail = b.lru_prev;
  }
  b.lru_prev = b.lru_next = kNoBlock;
  --lru.size;
}

void BlockPool::LruPushBack(int32_t id) {
  KvBlock& b = blocks_[id];
  Lru& lru = LruOf(id);
  b.lru_prev = lru.tail;
  b.lru_next = kNoBlock;
  if (lru.tail != kNoBlock) {
    blocks_[lru.tail].lru_next = id;
  } else {
    lru.head = id;
  }
  lru.tail = id;
  ++lru.size;
}

}  // namespace tandem::kv
