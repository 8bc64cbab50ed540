// The disk tier's index log: the on-disk format that makes a tier's blocks survive a restart.
//
// A tier directory holds segment files (preallocated, `segment_bytes` each) with block bytes at
// aligned addresses, and `index.log`: a 64-byte header (format version and segment geometry),
// then fixed-size 64-byte records appended in order. A put record names a block (hash, layout
// id, address, length, XXH3-64 of its bytes); a drop record frees one. Replaying the log in
// order rebuilds the index: a later put of an overlapping address range supersedes earlier ones,
// so an address reused after a drop record was lost is still resolved in favour of the newest
// writer. Each record carries an XXH3-64 of itself; replay stops at the first record that is
// torn or fails its check, and the tier truncates the log there. Block bytes are verified
// against the record's checksum on every read, so a record whose bytes never reached the disk
// is a miss, never wrong data.
//
// Integers are little-endian (the hosts Tandem supports).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::cache_store {

inline constexpr int64_t kDiskLogHeaderBytes = 64;
inline constexpr int64_t kDiskLogRecordBytes = 64;
inline constexpr int64_t kDiskAlignment = 4096;  // block addresses: a page, so reads are aligned
inline constexpr uint32_t kDiskFormatVersion = 1;

struct DiskGeometry {
  int64_t segment_bytes = 0;  // a multiple of kDiskAlignment
  int64_t num_segments = 0;
  int64_t capacity() const { return segment_bytes * num_segments; }
  bool operator==(const DiskGeometry&) const = default;
};

enum class DiskRecordType : uint8_t { kPut = 1, kDrop = 2 };

struct DiskLogRecord {
  DiskRecordType type = DiskRecordType::kPut;
  uint64_t hash = 0;
  uint64_t layout_id = 0;  // what the writer said the bytes are (the model and KV layout)
  int64_t address = 0;     // segment * segment_bytes + offset in the segment
  int64_t length = 0;
  uint64_t checksum64 = 0;  // XXH3-64 of the block's bytes
};

std::string EncodeDiskLogHeader(const DiskGeometry& geometry);
// The geometry a header records. InvalidArgument if the bytes are not a header of this format
// version (a different version is a different format: the tier starts empty).
absl::StatusOr<DiskGeometry> ParseDiskLogHeader(std::span<const uint8_t> bytes);

void EncodeDiskLogRecord(const DiskLogRecord& record, std::span<uint8_t, kDiskLogRecordBytes> out);
// One record. InvalidArgument (with why) for a record that is short, fails its checksum, has an
// unknown type, or addresses bytes outside one segment of `geometry` or off the alignment.
absl::StatusOr<DiskLogRecord> ParseDiskLogRecord(std::span<const uint8_t> bytes,
                                                 const DiskGeometry& geometry);

struct DiskLogReplay {
  std::vector<DiskLogRecord> live;  // surviving put records, oldest first
  int64_t records = 0;              // valid records read
  int64_t valid_bytes = 0;          // of the records: appends resume here
  int64_t discarded_bytes = 0;      // a torn or corrupt tail, and everything after it
  std::string discarded_why;        // the first bad record's error, if any
};

// Replays the records that follow a log's header.
DiskLogReplay ReplayDiskLog(std::span<const uint8_t> records, const DiskGeometry& geometry);

}  // namespace tandem::cache_store
