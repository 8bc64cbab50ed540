#include "cache_store/disk_tier.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/store/block_checksum.h"
#include "common/util/check.h"
#include "common/util/log.h"
#include "common/util/status_macros.h"

namespace tandem::cache_store {
namespace {

using Clock = std::chrono::steady_clock;

int64_t Paged(int64_t bytes) {
  return (bytes + kDiskAlignment - 1) / kDiskAlignment * kDiskAlignment;
}

double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string SegmentPath(const std::string& dir, int64_t i) {
  return (std::filesystem::path(dir) / absl::StrFormat("segment-%05d.dat", i)).string();
}

// The geometry the options ask for: whole segments, at least one, page-aligned.
absl::StatusOr<DiskGeometry> GeometryOf(const DiskTierOptions& o) {
  if (o.directory.empty()) return absl::InvalidArgumentError("disk tier: no directory");
  if (o.capacity_bytes < kDiskAlignment || o.segment_bytes < kDiskAlignment) {
    return absl::InvalidArgumentError(absl::StrCat("disk tier: capacity_bytes (", o.capacity_bytes,
                                                   ") and segment_bytes (", o.segment_bytes,
                                                   ") must be at least ", kDiskAlignment));
  }
  DiskGeometry g;
  g.segment_bytes = std::min(o.capacity_bytes, o.segment_bytes) / kDiskAlignment * kDiskAlignment;
  g.num_segments = o.capacity_bytes / g.segment_bytes;
  return g;
}

}  // namespace

absl::StatusOr<std::unique_ptr<DiskTier>> DiskTier::Open(const DiskTierOptions& options) {
  TANDEM_ASSIGN_OR_RETURN(DiskGeometry geometry, GeometryOf(options));
  std::unique_ptr<DiskTier> tier(new DiskTier(options, geometry));
  tier->fs_ = options.fs != nullptr ? options.fs : &PosixDiskFs();
  TANDEM_RETURN_IF_ERROR(tier->fs_->CreateDirectories(options.directory));
  TANDEM_RETURN_IF_ERROR(tier->Recover());
  return tier;
}

DiskTier::~DiskTier() {
  absl::MutexLock log(&log_mu_);
  std::vector<DiskLogRecord> drops;
  {
    absl::MutexLock lock(&mu_);
    drops = std::exchange(drops_, {});
  }
  if (!drops.empty() && log_ != nullptr) AppendToLog(drops).IgnoreError();  // best effort
}

std::string DiskTier::LogPath() const {
  return (std::filesystem::path(options_.directory) / "index.log").string();
}

absl::Status DiskTier::StartEmptyLog() {
  TANDEM_RETURN_IF_ERROR(log_->Truncate(0));
  const std::string header = EncodeDiskLogHeader(geometry_);
  TANDEM_RETURN_IF_ERROR(
      log_->Write({reinterpret_cast<const uint8_t*>(header.data()), header.size()}, 0));
  TANDEM_RETURN_IF_ERROR(log_->Sync());
  log_end_ = kDiskLogHeaderBytes;
  log_records_ = 0;
  return absl::OkStatus();
}

absl::Status DiskTier::Recover() {
  absl::MutexLock log(&log_mu_);
  TANDEM_ASSIGN_OR_RETURN(log_, fs_->Open(LogPath()));
  TANDEM_ASSIGN_OR_RETURN(int64_t size, log_->Size());
  std::vector<uint8_t> bytes(static_cast<size_t>(size));
  TANDEM_RETURN_IF_ERROR(log_->Read(bytes, 0));
  DiskLogReplay replay;
  absl::StatusOr<DiskGeometry> found = ParseDiskLogHeader(bytes);
  if (found.ok() && *found == geometry_) {
    replay = ReplayDiskLog(std::span<const uint8_t>(bytes).subspan(kDiskLogHeaderBytes), geometry_);
    log_end_ = kDiskLogHeaderBytes + replay.valid_bytes;
    log_records_ = replay.records;
    if (replay.discarded_bytes > 0) {
      Log(LogLevel::kWarning, "cache-store",
          absl::StrCat("disk tier ", options_.directory, ": dropped ", replay.discarded_bytes,
                       " bytes of log tail (", replay.discarded_why, ")"));
      TANDEM_RETURN_IF_ERROR(log_->Truncate(log_end_));
      TANDEM_RETURN_IF_ERROR(log_->Sync());
    }
  } else {
    if (size > 0) {
      Log(LogLevel::kWarning, "cache-store",
          absl::StrCat("disk tier ", options_.directory, ": starting empty, the log found is ",
                       found.ok() ? absl::StrCat("of another geometry (", found->num_segments,
                                                 " x ", found->segment_bytes, " bytes)")
                                  : std::string(found.status().message())));
    }
    TANDEM_RETURN_IF_ERROR(StartEmptyLog());
  }
  for (int64_t i = 0; i < geometry_.num_segments; ++i) {
    TANDEM_ASSIGN_OR_RETURN(auto segment, fs_->Open(SegmentPath(options_.directory, i)));
    TANDEM_ASSIGN_OR_RETURN(int64_t have, segment->Size());
    if (have < geometry_.segment_bytes) {
      if (absl::Status s = segment->Preallocate(geometry_.segment_bytes); !s.ok()) {
        // A full disk is not fatal: the file stays sparse and writes that find no room fail.
        Log(LogLevel::kWarning, "cache-store", absl::StrCat("disk tier: ", s.message()));
        TANDEM_RETURN_IF_ERROR(segment->Truncate(geometry_.segment_bytes));
      }
    }
    segments_.push_back(std::move(segment));
  }
  // Segments of a larger geometry than this one hold nothing the log names any more.
  for (int64_t i = geometry_.num_segments;
       std::filesystem::exists(SegmentPath(options_.directory, i)); ++i) {
    TANDEM_RETURN_IF_ERROR(fs_->Remove(SegmentPath(options_.directory, i)));
  }
  absl::MutexLock lock(&mu_);
  for (int64_t i = 0; i < geometry_.num_segments; ++i) {
    space_.emplace_back(geometry_.segment_bytes, kDiskAlignment);
  }
  for (const DiskLogRecord& r : replay.live) {
    const bool free = space_[static_cast<size_t>(r.address / geometry_.segment_bytes)].AllocateAt(
        r.address % geometry_.segment_bytes, r.length);
    TANDEM_CHECK(free, "the log's replay left overlapping blocks");
    Entry& e = entries_[r.hash];
    e = NewEntry(r.address, r.length, r.layout_id, r.checksum64);
    e.ready = true;
    e.lru = lru_.insert(lru_.end(), r.hash);
    used_bytes_ += Paged(r.length);
  }
  counters_.recovered_blocks = static_cast<int64_t>(replay.live.size());
  counters_.discarded_log_bytes = replay.discarded_bytes;
  return absl::OkStatus();
}

DiskTier::Entry DiskTier::NewEntry(int64_t address, int64_t length, uint64_t layout_id,
                                   uint64_t checksum64) {
  Entry e;
  e.address = address;
  e.length = length;
  e.layout_id = layout_id;
  e.checksum64 = checksum64;
  e.generation = next_generation_++;
  return e;
}

std::optional<int64_t> DiskTier::AllocateEvicting(int64_t length) {
  if (length > geometry_.segment_bytes) return std::nullopt;
  const size_t n = space_.size();
  while (true) {
    for (size_t i = 0; i < n; ++i) {
      const size_t s = (next_segment_ + i) % n;
      if (space_[s].largest_free_range() < Paged(length)) continue;
      next_segment_ = s;
      return static_cast<int64_t>(s) * geometry_.segment_bytes + *space_[s].Allocate(length);
    }
    if (lru_.empty()) return std::nullopt;  // the rest is being written
    Remove(entries_.find(lru_.front()));
    ++counters_.evictions;
  }
}

void DiskTier::Remove(Entries::iterator it) {
  Entry& e = it->second;
  TANDEM_CHECK(e.ready, "removing a block still being written");
  lru_.erase(e.lru);
  space_[static_cast<size_t>(e.address / geometry_.segment_bytes)].Free(
      e.address % geometry_.segment_bytes, e.length);
  used_bytes_ -= Paged(e.length);
  drops_.push_back(DiskLogRecord{DiskRecordType::kDrop, it->first, e.layout_id, e.address, e.length,
                                 e.checksum64});
  entries_.erase(it);
}

absl::Status DiskTier::AppendToLog(std::span<const DiskLogRecord> records) {
  if (records.empty()) return absl::OkStatus();
  std::vector<uint8_t> bytes(records.size() * kDiskLogRecordBytes);
  for (size_t i = 0; i < records.size(); ++i) {
    EncodeDiskLogRecord(
        records[i], std::span<uint8_t, kDiskLogRecordBytes>(bytes.data() + i * kDiskLogRecordBytes,
                                                            kDiskLogRecordBytes));
  }
  absl::Status s = log_->Write(bytes, log_end_);
  if (s.ok()) s = log_->Sync();
  if (!s.ok()) {
    // Whatever part landed is cut off, so a shorter append later leaves no stale records after
    // its end (best effort: were they left, replay's newest-wins rule and the checksums still
    // keep wrong bytes from being served).
    log_->Truncate(log_end_).IgnoreError();
    return s;
  }
  log_end_ += static_cast<int64_t>(bytes.size());
  log_records_ += static_cast<int64_t>(records.size());
  return absl::OkStatus();
}

void DiskTier::MaybeCompactLog() {
  std::vector<DiskLogRecord> live;
  {
    absl::MutexLock lock(&mu_);
    if (log_records_ < options_.compact_log_records ||
        log_records_ < 4 * static_cast<int64_t>(entries_.size()))
      return;
    live.reserve(lru_.size());
    for (uint64_t hash : lru_) {
      const Entry& e = entries_.at(hash);
      live.push_back({DiskRecordType::kPut, hash, e.layout_id, e.address, e.length, e.checksum64});
    }
  }
  if (absl::Status s = RewriteLog(live); !s.ok()) {
    Log(LogLevel::kWarning, "cache-store",
        absl::StrCat("disk tier: log compaction: ", s.message()));
  }
}

absl::Status DiskTier::RewriteLog(std::span<const DiskLogRecord> live) {
  const std::string tmp = LogPath() + ".tmp";
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<DiskFile> file, fs_->Open(tmp));
  std::swap(file, log_);  // write the new log through the usual path
  const int64_t end = log_end_, records = log_records_;
  absl::Status written = StartEmptyLog();
  if (written.ok()) written = AppendToLog(live);
  std::swap(file, log_);  // the old log stays current until the rename
  const int64_t new_end = log_end_, new_records = log_records_;
  log_end_ = end;
  log_records_ = records;
  TANDEM_RETURN_IF_ERROR(written);
  TANDEM_RETURN_IF_ERROR(fs_->Replace(tmp, LogPath()));
  log_ = std::move(file);
  log_end_ = new_end;
  log_records_ = new_records;
  return absl::OkStatus();
}

std::vector<absl::Status> DiskTier::Write(std::span<const DiskBlockWrite> blocks) {
  std::vector<absl::Status> out(blocks.size());
  std::vector<size_t> planned;  // blocks given space, in order
  std::vector<int64_t> address(blocks.size(), -1);
  {
    absl::MutexLock lock(&mu_);
    for (size_t i = 0; i < blocks.size(); ++i) {
      const DiskBlockWrite& b = blocks[i];
      if (entries_.contains(b.hash)) {
        out[i] = absl::AlreadyExistsError(absl::StrCat("block ", b.hash, " is on disk"));
        continue;
      }
      const int64_t length = static_cast<int64_t>(b.data.size());
      std::optional<int64_t> at = length > 0 ? AllocateEvicting(length) : std::nullopt;
      if (!at) {
        ++counters_.write_no_room;
        out[i] = absl::ResourceExhaustedError(
            absl::StrCat("block ", b.hash, ": ", length, " bytes do not fit a ",
                         geometry_.segment_bytes, "-byte segment beside the blocks being written"));
        continue;
      }
      address[i] = *at;
      entries_[b.hash] = NewEntry(*at, length, b.layout_id, b.checksum64);
      used_bytes_ += Paged(length);
      planned.push_back(i);
    }
  }
  // The bytes, then one sync per segment touched.
  std::set<int64_t> touched;
  for (size_t i : planned) {
    const auto t0 = Clock::now();
    out[i] = SegmentOf(address[i]).Write(blocks[i].data, address[i] % geometry_.segment_bytes);
    if (!out[i].ok()) continue;
    touched.insert(address[i] / geometry_.segment_bytes);
    if (options_.on_write) options_.on_write(SecondsSince(t0), blocks[i].data.size());
  }
  for (int64_t segment : touched) {
    absl::Status s = segments_[static_cast<size_t>(segment)]->Sync();
    if (s.ok()) continue;
    for (size_t i : planned) {
      if (out[i].ok() && address[i] / geometry_.segment_bytes == segment) out[i] = s;
    }
  }
  // Then the records: the drops since the last write first, then this batch's puts.
  {
    absl::MutexLock log(&log_mu_);
    std::vector<DiskLogRecord> records;
    {
      absl::MutexLock lock(&mu_);
      records = std::exchange(drops_, {});
    }
    const size_t num_drops = records.size();
    for (size_t i : planned) {
      if (!out[i].ok()) continue;
      const DiskBlockWrite& b = blocks[i];
      records.push_back({DiskRecordType::kPut, b.hash, b.layout_id, address[i],
                         static_cast<int64_t>(b.data.size()), b.checksum64});
    }
    if (absl::Status s = AppendToLog(records); !s.ok()) {
      for (size_t i : planned) {
        if (out[i].ok()) out[i] = s;
      }
      absl::MutexLock lock(&mu_);
      drops_.insert(drops_.begin(), records.begin(), records.begin() + num_drops);
    } else {
      MaybeCompactLog();
    }
  }
  absl::MutexLock lock(&mu_);
  for (size_t i : planned) {
    auto it = entries_.find(blocks[i].hash);
    TANDEM_CHECK(it != entries_.end() && !it->second.ready, "a block being written went away");
    if (out[i].ok()) {
      it->second.ready = true;
      it->second.lru = lru_.insert(lru_.end(), blocks[i].hash);
      ++counters_.writes;
      counters_.write_bytes += static_cast<int64_t>(blocks[i].data.size());
    } else {
      Entry& e = it->second;
      space_[static_cast<size_t>(e.address / geometry_.segment_bytes)].Free(
          e.address % geometry_.segment_bytes, e.length);
      used_bytes_ -= Paged(e.length);
      entries_.erase(it);
      ++counters_.write_failures;
    }
  }
  return out;
}

void DiskTier::ReadOne(DiskBlockRead& read) {
  Entry e;
  {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(read.hash);
    if (it == entries_.end() || !it->second.ready) {
      ++counters_.misses;
      read.status = absl::NotFoundError(absl::StrCat("block ", read.hash, " is not on disk"));
      return;
    }
    if (read.layout_id != 0 && it->second.layout_id != read.layout_id) {
      ++counters_.stale;
      Remove(it);
      read.status = absl::FailedPreconditionError(
          absl::StrCat("block ", read.hash, " on disk is of another layout; dropped"));
      return;
    }
    if (static_cast<int64_t>(read.out.size()) != it->second.length) {
      read.status = absl::InvalidArgumentError(absl::StrCat(
          "block ", read.hash, ": ", it->second.length, " bytes, not ", read.out.size()));
      return;
    }
    e = it->second;
  }
  const auto t0 = Clock::now();
  absl::Status s = SegmentOf(e.address).Read(read.out, e.address % geometry_.segment_bytes);
  const uint64_t sum = s.ok() ? store::BlockChecksum64(read.out) : 0;
  const double seconds = SecondsSince(t0);
  {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(read.hash);
    const bool same = it != entries_.end() && it->second.generation == e.generation;
    if (s.ok() && sum == e.checksum64) {
      // Intact even if evicted meanwhile: the bytes are the ones the record vouched for.
      ++counters_.hits;
      counters_.read_bytes += e.length;
      if (same) lru_.splice(lru_.end(), lru_, it->second.lru);
      read.checksum64 = sum;
      read.status = absl::OkStatus();
    } else if (s.ok() && same) {
      ++counters_.corrupt;
      Remove(it);
      read.status = absl::DataLossError(
          absl::StrCat("block ", read.hash, " on disk failed its checksum; dropped"));
    } else {
      ++counters_.misses;  // an I/O error, or the space was reused during the read
      read.status =
          s.ok() ? absl::NotFoundError(absl::StrCat("block ", read.hash, " was evicted")) : s;
    }
  }
  if (s.ok() && options_.on_read) options_.on_read(seconds, e.length);
}

void DiskTier::Read(std::span<DiskBlockRead> reads) {
  if (reads.size() == 1) return ReadOne(reads[0]);
  // A Mutex, not a BlockingCounter: the TSan build sees absl::Mutex (tests/tsan/).
  absl::Mutex mu;
  int left = static_cast<int>(reads.size());
  for (DiskBlockRead& r : reads) {
    io_.Submit([this, &r, &mu, &left] {
      ReadOne(r);
      absl::MutexLock lock(&mu);
      --left;
    });
  }
  absl::MutexLock lock(&mu);
  mu.Await(absl::Condition(
      +[](int* n) { return *n == 0; }, &left));
}

bool DiskTier::Contains(uint64_t hash) const {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(hash);
  return it != entries_.end() && it->second.ready;
}

std::optional<int64_t> DiskTier::SizeOf(uint64_t hash) const {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(hash);
  if (it == entries_.end() || !it->second.ready) return std::nullopt;
  return it->second.length;
}

void DiskTier::Erase(uint64_t hash) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(hash);
  if (it != entries_.end() && it->second.ready) Remove(it);
}

DiskTierStats DiskTier::Stats() const {
  absl::MutexLock lock(&mu_);
  DiskTierStats s = counters_;
  s.capacity_bytes = geometry_.capacity();
  s.used_bytes = used_bytes_;
  s.blocks = static_cast<int64_t>(lru_.size());
  return s;
}

}  // namespace tandem::cache_store
