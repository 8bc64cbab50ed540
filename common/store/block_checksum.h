// Checksums of block bytes. BlockChecksum (XXH32) is the one the gRPC stream carries; the
// shared-memory path uses the 64-bit XXH3, which runs near memcpy speed with AVX2 where XXH32
// runs at about half of it, so that path is not bound by its own integrity check.
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace tandem::store {

// Checksum of a block's bytes as the store and its gRPC clients compute it (XXH32, seed 0).
uint32_t BlockChecksum(std::span<const uint8_t> bytes);

// XXH3-64 of a block's bytes: the checksum of the shared-memory path.
uint64_t BlockChecksum64(std::span<const uint8_t> bytes);

// Copies `src` into `dst` (same size) and returns the BlockChecksum64 of `src`, in one pass:
// each chunk is hashed first, which brings it into L1 for the copy, so the check adds little.
uint64_t CopyWithChecksum64(std::span<uint8_t> dst, std::span<const uint8_t> src);

// Appends `src` to `dst` and returns the BlockChecksum64 of the bytes appended, read back from
// `dst` in the same pass. Unlike resizing then copying, it never zero-fills the new bytes.
uint64_t AppendWithChecksum64(std::string& dst, std::span<const uint8_t> src);

}  // namespace tandem::store
