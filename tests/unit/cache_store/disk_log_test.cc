#include "cache_store/disk_log.h"

#include <array>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::cache_store {
namespace {

constexpr DiskGeometry kGeometry{16 * kDiskAlignment, 4};

std::vector<uint8_t> Encode(const std::vector<DiskLogRecord>& records) {
  std::vector<uint8_t> out(records.size() * kDiskLogRecordBytes);
  for (size_t i = 0; i < records.size(); ++i) {
    EncodeDiskLogRecord(records[i], std::span<uint8_t, kDiskLogRecordBytes>(
                                        out.data() + i * kDiskLogRecordBytes, kDiskLogRecordBytes));
  }
  return out;
}

DiskLogRecord PutAt(uint64_t hash, int64_t address, int64_t length = kDiskAlignment) {
  return {DiskRecordType::kPut, hash, 7, address, length, hash * 31};
}

TEST(DiskLogTest, HeaderRoundTripsAndRejectsOtherFormats) {
  std::string header = EncodeDiskLogHeader(kGeometry);
  ASSERT_EQ(header.size(), kDiskLogHeaderBytes);
  auto bytes = [&] {
    return std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(header.data()), header.size());
  };
  ASSERT_TRUE(ParseDiskLogHeader(bytes()).ok());
  EXPECT_EQ(*ParseDiskLogHeader(bytes()), kGeometry);
  EXPECT_FALSE(ParseDiskLogHeader(bytes().first(40)).ok());
  header[9] ^= 1;  // any changed byte fails the header's own checksum
  EXPECT_FALSE(ParseDiskLogHeader(bytes()).ok());
  header = EncodeDiskLogHeader(kGeometry);
  header[3] = 'x';
  EXPECT_NE(ParseDiskLogHeader(bytes()).status().message().find("not a Tandem"), std::string::npos);
  header = EncodeDiskLogHeader({kDiskAlignment + 1, 1});  // not page-aligned segments
  EXPECT_FALSE(ParseDiskLogHeader(bytes()).ok());
}

TEST(DiskLogTest, RecordRoundTripsAndIsCheckedAgainstTheGeometry) {
  const DiskLogRecord r = PutAt(42, 3 * kGeometry.segment_bytes + kDiskAlignment, 5000);
  std::vector<uint8_t> bytes = Encode({r});
  auto parsed = ParseDiskLogRecord(bytes, kGeometry);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->hash, 42u);
  EXPECT_EQ(parsed->layout_id, 7u);
  EXPECT_EQ(parsed->address, r.address);
  EXPECT_EQ(parsed->length, 5000);
  EXPECT_EQ(parsed->checksum64, r.checksum64);
  EXPECT_FALSE(ParseDiskLogRecord(std::span(bytes).first(63), kGeometry).ok());
  bytes[20] ^= 0x10;
  EXPECT_NE(ParseDiskLogRecord(bytes, kGeometry).status().message().find("checksum"),
            std::string::npos);
  // Crossing a segment's end, off the alignment, past the last segment, empty.
  for (const DiskLogRecord& bad :
       {PutAt(1, kGeometry.segment_bytes - kDiskAlignment, 2 * kDiskAlignment), PutAt(1, 100),
        PutAt(1, kGeometry.capacity()), PutAt(1, 0, 0), PutAt(1, -kDiskAlignment)}) {
    EXPECT_FALSE(ParseDiskLogRecord(Encode({bad}), kGeometry).ok()) << bad.address;
  }
}

TEST(DiskLogTest, ReplayKeepsTheNewestWriterOfEveryAddress) {
  const int64_t page = kDiskAlignment;
  DiskLogRecord drop = PutAt(2, 1 * page);
  drop.type = DiskRecordType::kDrop;
  DiskLogRecord stale_drop = PutAt(3, 9 * page);  // block 3 is not there: ignored
  stale_drop.type = DiskRecordType::kDrop;
  const std::vector<uint8_t> log = Encode({
      PutAt(1, 0), PutAt(2, page), PutAt(3, 2 * page, 2 * page), drop, stale_drop,
      PutAt(4, 3 * page),  // overlaps block 3's second page: block 3 is gone
      PutAt(1, 6 * page),  // block 1 again, elsewhere: the old copy is gone
      PutAt(5, 0),         // reuses block 1's old address
  });
  DiskLogReplay replay = ReplayDiskLog(log, kGeometry);
  EXPECT_EQ(replay.records, 8);
  EXPECT_EQ(replay.discarded_bytes, 0);
  ASSERT_EQ(replay.live.size(), 3u);
  EXPECT_EQ(replay.live[0].hash, 4u);  // oldest first
  EXPECT_EQ(replay.live[1].hash, 1u);
  EXPECT_EQ(replay.live[1].address, 6 * page);
  EXPECT_EQ(replay.live[2].hash, 5u);
}

TEST(DiskLogTest, ReplayStopsAtATornOrCorruptRecord) {
  std::vector<uint8_t> log = Encode({PutAt(1, 0), PutAt(2, kDiskAlignment), PutAt(3, 0)});
  std::vector<uint8_t> torn(log.begin(), log.end() - 10);
  DiskLogReplay replay = ReplayDiskLog(torn, kGeometry);
  EXPECT_EQ(replay.live.size(), 2u);
  EXPECT_EQ(replay.valid_bytes, 2 * kDiskLogRecordBytes);
  EXPECT_EQ(replay.discarded_bytes, kDiskLogRecordBytes - 10);
  EXPECT_NE(replay.discarded_why.find("torn"), std::string::npos);

  log[kDiskLogRecordBytes + 30] ^= 1;  // the second record: it and everything after are dropped
  replay = ReplayDiskLog(log, kGeometry);
  ASSERT_EQ(replay.live.size(), 1u);
  EXPECT_EQ(replay.live[0].hash, 1u);
  EXPECT_EQ(replay.discarded_bytes, 2 * kDiskLogRecordBytes);
}

}  // namespace
}  // namespace tandem::cache_store
