#include "common/kv/block_memory.h"

#include <sys/mman.h>

#include <cstring>

#include "absl/strings/str_cat.h"

namespace tandem::kv {
namespace {

class HostMemory final : public BlockMemory {
 public:
  absl::StatusOr<uint8_t*> Map(size_t bytes) override {
    // Page-aligned (>= 64) and zero-filled lazily by the kernel on first touch, so a large pool
    // costs nothing until used.
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      return absl::ResourceExhaustedError(absl::StrCat("cannot map ", bytes, " bytes"));
    }
    return static_cast<uint8_t*>(p);
  }
  void Unmap(uint8_t* base, size_t bytes) override { munmap(base, bytes); }
  bool host_addressable() const override { return true; }
  void ToHost(uint8_t* host_dst, const uint8_t* src, size_t bytes) override {
    std::memcpy(host_dst, src, bytes);
  }
  void FromHost(uint8_t* dst, const uint8_t* host_src, size_t bytes) override {
    std::memcpy(dst, host_src, bytes);
  }
};

}  // namespace

BlockMemory& HostBlockMemory() {
  static HostMemory* memory = new HostMemory();
  return *memory;
}

}  // namespace tandem::kv
