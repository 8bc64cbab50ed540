#include "common/util/huge_page_arena.h"

#include <sys/mman.h>

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tandem {
namespace {
constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kChunkBytes = size_t{256} << 20;
constexpr size_t kAlign = 64;
}  // namespace

HugePageArena::~HugePageArena() {
  for (const Chunk& c : chunks_) ::munmap(c.data, c.size);
}

absl::StatusOr<uint8_t*> HugePageArena::Allocate(size_t bytes) {
  bytes = (bytes + kAlign - 1) / kAlign * kAlign;
  if (!chunks_.empty() && chunks_.back().size - chunks_.back().used >= bytes) {
    Chunk& c = chunks_.back();
    uint8_t* p = c.data + c.used;
    c.used += bytes;
    return p;
  }
  // Over-map by one huge page so the chunk can start on a 2 MiB boundary.
  size_t size = std::max(kChunkBytes, (bytes + kHugePage - 1) / kHugePage * kHugePage);
  void* raw = ::mmap(nullptr, size + kHugePage, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot map ", size, " bytes of anonymous memory for weights"));
  }
  auto* base = static_cast<uint8_t*>(raw);
  auto* aligned = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(base) + kHugePage - 1) /
                                             kHugePage * kHugePage);
  if (aligned > base) ::munmap(base, aligned - base);
  uint8_t* end = base + size + kHugePage;
  if (end > aligned + size) ::munmap(aligned + size, end - (aligned + size));
  ::madvise(aligned, size, MADV_HUGEPAGE);  // advisory: plain pages still work
  chunks_.push_back({aligned, size, bytes});
  reserved_ += size;
  return aligned;
}

}  // namespace tandem
