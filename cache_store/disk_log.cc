#include "cache_store/disk_log.h"

#include <algorithm>
#include <cstring>
#include <iterator>
#include <map>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "xxhash.h"

namespace tandem::cache_store {
namespace {

constexpr char kHeaderMagic[8] = {'T', 'N', 'D', 'M', 'K', 'V', 'L', 'G'};
constexpr uint32_t kRecordMagic = 0x52444b54;  // "TKDR"
constexpr size_t kCheckedBytes = 56;           // the rest is the XXH3-64 of these

template <typename T>
void Put(uint8_t* out, size_t at, T value) {
  std::memcpy(out + at, &value, sizeof(T));
}

template <typename T>
T Get(const uint8_t* in, size_t at) {
  T value;
  std::memcpy(&value, in + at, sizeof(T));
  return value;
}

void Seal(uint8_t* bytes) {
  Put<uint64_t>(bytes, kCheckedBytes, XXH3_64bits(bytes, kCheckedBytes));
}

bool Sealed(const uint8_t* bytes) {
  return Get<uint64_t>(bytes, kCheckedBytes) == XXH3_64bits(bytes, kCheckedBytes);
}

}  // namespace

std::string EncodeDiskLogHeader(const DiskGeometry& geometry) {
  std::string out(kDiskLogHeaderBytes, '\0');
  auto* bytes = reinterpret_cast<uint8_t*>(out.data());
  std::memcpy(bytes, kHeaderMagic, sizeof(kHeaderMagic));
  Put<uint32_t>(bytes, 8, kDiskFormatVersion);
  Put<uint32_t>(bytes, 12, static_cast<uint32_t>(kDiskLogRecordBytes));
  Put<int64_t>(bytes, 16, geometry.segment_bytes);
  Put<int64_t>(bytes, 24, geometry.num_segments);
  Seal(bytes);
  return out;
}

absl::StatusOr<DiskGeometry> ParseDiskLogHeader(std::span<const uint8_t> bytes) {
  if (bytes.size() < static_cast<size_t>(kDiskLogHeaderBytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("disk log header: ", bytes.size(), " of ", kDiskLogHeaderBytes, " bytes"));
  }
  if (std::memcmp(bytes.data(), kHeaderMagic, sizeof(kHeaderMagic)) != 0) {
    return absl::InvalidArgumentError("disk log header: not a Tandem disk tier log");
  }
  if (!Sealed(bytes.data())) {
    return absl::InvalidArgumentError("disk log header: checksum mismatch");
  }
  const auto version = Get<uint32_t>(bytes.data(), 8);
  const auto record_bytes = Get<uint32_t>(bytes.data(), 12);
  if (version != kDiskFormatVersion || record_bytes != kDiskLogRecordBytes) {
    return absl::InvalidArgumentError(absl::StrCat("disk log header: format version ", version,
                                                   ", this build reads ", kDiskFormatVersion));
  }
  DiskGeometry g{Get<int64_t>(bytes.data(), 16), Get<int64_t>(bytes.data(), 24)};
  if (g.segment_bytes <= 0 || g.segment_bytes % kDiskAlignment != 0 || g.num_segments <= 0 ||
      g.num_segments > (int64_t{1} << 62) / g.segment_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("disk log header: bad geometry ", g.num_segments, " x ", g.segment_bytes));
  }
  return g;
}

void EncodeDiskLogRecord(const DiskLogRecord& record, std::span<uint8_t, kDiskLogRecordBytes> out) {
  uint8_t* bytes = out.data();
  std::memset(bytes, 0, kDiskLogRecordBytes);
  Put<uint32_t>(bytes, 0, kRecordMagic);
  Put<uint8_t>(bytes, 4, static_cast<uint8_t>(record.type));
  Put<uint64_t>(bytes, 8, record.hash);
  Put<uint64_t>(bytes, 16, record.layout_id);
  Put<int64_t>(bytes, 24, record.address);
  Put<int64_t>(bytes, 32, record.length);
  Put<uint64_t>(bytes, 40, record.checksum64);
  Seal(bytes);
}

absl::StatusOr<DiskLogRecord> ParseDiskLogRecord(std::span<const uint8_t> bytes,
                                                 const DiskGeometry& geometry) {
  if (bytes.size() < static_cast<size_t>(kDiskLogRecordBytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("torn record: ", bytes.size(), " of ", kDiskLogRecordBytes, " bytes"));
  }
  const uint8_t* in = bytes.data();
  if (Get<uint32_t>(in, 0) != kRecordMagic) return absl::InvalidArgumentError("no record magic");
  if (!Sealed(in)) return absl::InvalidArgumentError("record checksum mismatch");
  DiskLogRecord r;
  const auto type = Get<uint8_t>(in, 4);
  if (type != static_cast<uint8_t>(DiskRecordType::kPut) &&
      type != static_cast<uint8_t>(DiskRecordType::kDrop)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown record type ", type));
  }
  r.type = static_cast<DiskRecordType>(type);
  r.hash = Get<uint64_t>(in, 8);
  r.layout_id = Get<uint64_t>(in, 16);
  r.address = Get<int64_t>(in, 24);
  r.length = Get<int64_t>(in, 32);
  r.checksum64 = Get<uint64_t>(in, 40);
  // Checked without overflow: address in [0, capacity), length in [1, segment_bytes].
  if (r.address < 0 || r.address >= geometry.capacity() || r.address % kDiskAlignment != 0 ||
      r.length <= 0 || r.length > geometry.segment_bytes ||
      r.address % geometry.segment_bytes > geometry.segment_bytes - r.length) {
    return absl::InvalidArgumentError(absl::StrCat("record of block ", r.hash, ": ", r.length,
                                                   " bytes at ", r.address,
                                                   " are not inside one segment"));
  }
  return r;
}

DiskLogReplay ReplayDiskLog(std::span<const uint8_t> records, const DiskGeometry& geometry) {
  struct Live {
    DiskLogRecord record;
    int64_t sequence;
  };
  absl::flat_hash_map<uint64_t, Live> live;  // by block hash
  std::map<int64_t, uint64_t> by_address;    // live blocks' start address -> hash
  auto erase = [&](absl::flat_hash_map<uint64_t, Live>::iterator it) {
    by_address.erase(it->second.record.address);
    live.erase(it);
  };
  DiskLogReplay out;
  size_t at = 0;
  for (; at < records.size(); at += kDiskLogRecordBytes) {
    absl::StatusOr<DiskLogRecord> r = ParseDiskLogRecord(records.subspan(at), geometry);
    if (!r.ok()) {
      out.discarded_why = std::string(r.status().message());
      break;
    }
    ++out.records;
    auto same = live.find(r->hash);
    if (r->type == DiskRecordType::kDrop) {
      if (same != live.end() && same->second.record.address == r->address) erase(same);
      continue;
    }
    if (same != live.end()) erase(same);
    // Newer bytes at an address supersede every older block they overlap.
    auto it = by_address.lower_bound(r->address);
    if (it != by_address.begin()) {
      auto prev = std::prev(it);
      if (const auto& p = live.at(prev->second).record; p.address + p.length > r->address) {
        it = prev;
      }
    }
    while (it != by_address.end() && it->first < r->address + r->length) {
      auto next = std::next(it);
      live.erase(it->second);
      by_address.erase(it);
      it = next;
    }
    live[r->hash] = Live{*r, out.records};
    by_address[r->address] = r->hash;
  }
  out.valid_bytes = static_cast<int64_t>(std::min(at, records.size()));
  out.discarded_bytes = static_cast<int64_t>(records.size()) - out.valid_bytes;
  std::vector<Live> ordered;
  ordered.reserve(live.size());
  for (auto& [hash, l] : live) ordered.push_back(l);
  std::sort(ordered.begin(), ordered.end(),
            [](const Live& a, const Live& b) { return a.sequence < b.sequence; });
  for (const Live& l : ordered) out.live.push_back(l.record);
  return out;
}

}  // namespace tandem::cache_store
