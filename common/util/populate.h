// Page tables filled ahead of the writes that would otherwise fault them in one page at a time.
#pragma once

#include <atomic>
#include <cstdint>

#include "absl/status/status.h"

namespace tandem {

// Maps every page of [base, base + bytes) writable (`base` page-aligned, the range part of a
// writable mapping), allocating the pages its memory lacks, without changing a byte
// (MADV_POPULATE_WRITE): a later write there costs no page fault, which on a fresh shared-memory
// arena is most of a write's time (docs/benchmarks.md). Works in steps and returns Cancelled
// between two once `stop` is set. ResourceExhausted when the memory is not there; Unimplemented
// where the kernel lacks it (before Linux 5.14).
absl::Status PopulateWritable(uint8_t* base, int64_t bytes,
                              const std::atomic<bool>* stop = nullptr);

// Bytes of memory this process could still allocate: the kernel's MemAvailable, or less where
// its memory cgroup (v2 memory.max, v1 memory.limit_in_bytes, as /sys/fs/cgroup shows them to
// the process: a container's own) has less room left.
int64_t AvailableMemoryBytes();

}  // namespace tandem
