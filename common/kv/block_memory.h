#pragma once

// Where a KV pool's bytes live. By default in host memory (an anonymous mapping, zero-filled
// lazily); a device backend keeps them in its own memory, where only its kernels touch them and
// host code reads or writes whole blocks through ToHost / FromHost (the store hand-off,
// imports, mixed-precision narrowing, semantic eviction's key means).

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"

namespace tandem::kv {

class BlockMemory {
 public:
  virtual ~BlockMemory() = default;

  // `bytes` of zeroed memory, 64-byte aligned. ResourceExhausted, with the numbers, if it
  // cannot be had.
  virtual absl::StatusOr<uint8_t*> Map(size_t bytes) = 0;
  virtual void Unmap(uint8_t* base, size_t bytes) = 0;
  // True when host code may read and write the memory in place.
  virtual bool host_addressable() const = 0;
  virtual void ToHost(uint8_t* host_dst, const uint8_t* src, size_t bytes) = 0;
  virtual void FromHost(uint8_t* dst, const uint8_t* host_src, size_t bytes) = 0;
};

// Host memory: anonymous mappings, never shared between pools. Thread-safe.
BlockMemory& HostBlockMemory();

}  // namespace tandem::kv
