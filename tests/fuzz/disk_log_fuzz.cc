// libFuzzer target: a disk tier's index log (cache_store/disk_log.h) as a restarted shard reads
// it: the header, then every record replayed. Checks what recovery relies on: the blocks that
// survive replay lie inside one segment each and never overlap.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <span>

#include "cache_store/disk_log.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tandem::cache_store;
  std::span<const uint8_t> bytes(data, size);
  // Without a valid header, the bytes are records under a small fixed geometry.
  DiskGeometry geometry{16 * kDiskAlignment, 8};
  if (auto header = ParseDiskLogHeader(bytes); header.ok()) {
    geometry = *header;
    bytes = bytes.subspan(kDiskLogHeaderBytes);
  }
  DiskLogReplay replay = ReplayDiskLog(bytes, geometry);
  if (replay.valid_bytes + replay.discarded_bytes != static_cast<int64_t>(bytes.size())) abort();
  std::map<int64_t, int64_t> extents;  // address -> length
  for (const DiskLogRecord& r : replay.live) {
    if (r.type != DiskRecordType::kPut || r.length <= 0 ||
        r.address % geometry.segment_bytes + r.length > geometry.segment_bytes) {
      abort();
    }
    if (!extents.emplace(r.address, r.length).second) abort();
  }
  int64_t end = 0;
  for (const auto& [address, length] : extents) {
    if (address < end) abort();  // overlaps the previous block
    end = address + length;
  }
  return 0;
}
