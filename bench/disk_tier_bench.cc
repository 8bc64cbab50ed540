// The cache store's disk tier against the disk it runs on: block writes (group commits of
// --batch blocks, as the spill thread makes them) and batched parallel block reads (as a
// request's promotion makes them) through cache_store::DiskTier, beside plain sequential
// writes and reads of one file in 8 MiB pwrite/pread calls on the same directory (what `dd`
// does). The page cache is dropped for the files (fdatasync, then POSIX_FADV_DONTNEED) before
// every read phase, so reads come from the device.
//
//   disk-tier-bench --dir DIR [--block 512Ki] [--total 1Gi] [--batch 16] [--io-threads 4]
//                   [--reps 3]
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "cache_store/disk_tier.h"
#include "common/store/block_checksum.h"
#include "common/util/cli_args.h"
#include "common/util/status_macros.h"

namespace tandem::bench {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

double Quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))];
}

// Drops the page cache's copy of every file in `dir` (written and synced first).
absl::Status DropCache(const std::string& dir) {
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const int fd = ::open(entry.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return absl::InternalError(absl::StrCat("open ", entry.path().string()));
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
  return absl::OkStatus();
}

struct Figures {
  std::vector<double> write_gbs, read_gbs, read_ms;  // read_ms: per block, every rep
};

// Sequential writes and reads of one file of `total` bytes, 8 MiB per call.
absl::Status Sequential(const std::string& dir, int64_t total, Figures& f) {
  const std::string path = (std::filesystem::path(dir) / "sequential.dat").string();
  std::vector<uint8_t> buffer(8 << 20, 0x5a);
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return absl::InternalError(absl::StrCat("open ", path));
  auto t0 = Clock::now();
  for (int64_t at = 0; at < total; at += static_cast<int64_t>(buffer.size())) {
    if (::pwrite(fd, buffer.data(), buffer.size(), at) != static_cast<ssize_t>(buffer.size())) {
      ::close(fd);
      return absl::InternalError("sequential write");
    }
  }
  ::fdatasync(fd);
  f.write_gbs.push_back(total / Seconds(t0) / 1e9);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  t0 = Clock::now();
  for (int64_t at = 0; at < total; at += static_cast<int64_t>(buffer.size())) {
    if (::pread(fd, buffer.data(), buffer.size(), at) != static_cast<ssize_t>(buffer.size())) {
      ::close(fd);
      return absl::InternalError("sequential read");
    }
  }
  f.read_gbs.push_back(total / Seconds(t0) / 1e9);
  ::close(fd);
  std::filesystem::remove(path);
  return absl::OkStatus();
}

// One rep through a fresh DiskTier: every block written in batches, then read back in batches.
absl::Status Tier(const std::string& dir, int64_t block, int64_t total, int batch, int threads,
                  Figures& f) {
  const std::string tier_dir = (std::filesystem::path(dir) / "tier").string();
  std::filesystem::remove_all(tier_dir);
  std::vector<double> read_seconds;
  cache_store::DiskTierOptions o;
  o.directory = tier_dir;
  o.capacity_bytes = total + (int64_t{64} << 20);
  o.segment_bytes = int64_t{64} << 20;
  o.io_threads = threads;
  absl::Mutex mu;  // on_read runs on the tier's I/O threads, several at once
  o.on_read = [&](double seconds, int64_t) {
    absl::MutexLock lock(&mu);
    read_seconds.push_back(seconds);
  };
  TANDEM_ASSIGN_OR_RETURN(auto tier, cache_store::DiskTier::Open(o));
  // A few distinct buffers, reused under different hashes (the checksum is of the bytes).
  std::vector<std::vector<uint8_t>> data(static_cast<size_t>(batch));
  std::vector<uint64_t> sums;
  std::mt19937_64 rng(1);
  for (auto& d : data) {
    d.resize(static_cast<size_t>(block));
    for (auto& b : d) b = static_cast<uint8_t>(rng());
    sums.push_back(store::BlockChecksum64(d));
  }
  const int64_t blocks = total / block;
  auto t0 = Clock::now();
  for (int64_t first = 0; first < blocks; first += batch) {
    std::vector<cache_store::DiskBlockWrite> writes;
    for (int64_t h = first; h < std::min(blocks, first + batch); ++h) {
      const size_t i = static_cast<size_t>(h - first);
      writes.push_back({static_cast<uint64_t>(h + 1), 1, data[i], sums[i]});
    }
    for (const absl::Status& s : tier->Write(writes)) TANDEM_RETURN_IF_ERROR(s);
  }
  f.write_gbs.push_back(blocks * block / Seconds(t0) / 1e9);
  TANDEM_RETURN_IF_ERROR(DropCache(tier_dir));
  std::vector<std::vector<uint8_t>> out(static_cast<size_t>(batch),
                                        std::vector<uint8_t>(static_cast<size_t>(block)));
  t0 = Clock::now();
  for (int64_t first = 0; first < blocks; first += batch) {
    std::vector<cache_store::DiskBlockRead> reads;
    for (int64_t h = first; h < std::min(blocks, first + batch); ++h) {
      cache_store::DiskBlockRead r;
      r.hash = static_cast<uint64_t>(h + 1);
      r.out = out[static_cast<size_t>(h - first)];
      reads.push_back(r);
    }
    tier->Read(reads);
    for (const auto& r : reads) TANDEM_RETURN_IF_ERROR(r.status);
  }
  f.read_gbs.push_back(blocks * block / Seconds(t0) / 1e9);
  for (double s : read_seconds) f.read_ms.push_back(s * 1e3);
  tier.reset();
  std::filesystem::remove_all(tier_dir);
  return absl::OkStatus();
}

absl::Status Main(int argc, char** argv) {
  TANDEM_ASSIGN_OR_RETURN(CliArgs args, CliArgs::Parse(argc, argv, {}));
  TANDEM_RETURN_IF_ERROR(args.CheckKnown({"dir", "block", "total", "batch", "io-threads", "reps"}));
  TANDEM_ASSIGN_OR_RETURN(std::string dir, args.String("dir"));
  TANDEM_ASSIGN_OR_RETURN(int64_t block, ParseByteSize(args.StringOr("block", "512Ki")));
  TANDEM_ASSIGN_OR_RETURN(int64_t total, ParseByteSize(args.StringOr("total", "1Gi")));
  TANDEM_ASSIGN_OR_RETURN(int64_t batch, args.IntOr("batch", 16));
  TANDEM_ASSIGN_OR_RETURN(int64_t threads, args.IntOr("io-threads", 4));
  TANDEM_ASSIGN_OR_RETURN(int64_t reps, args.IntOr("reps", 3));
  if (block < 1 || total < block || batch < 1 || threads < 1 || reps < 1) {
    return absl::InvalidArgumentError(
        "need --block >= 1, --total >= --block, --batch, "
        "--io-threads and --reps >= 1");
  }
  std::filesystem::create_directories(dir);
  Figures seq, tier;
  for (int r = 0; r < reps; ++r) {  // interleaved, so drift hits both alike
    TANDEM_RETURN_IF_ERROR(Sequential(dir, total, seq));
    TANDEM_RETURN_IF_ERROR(
        Tier(dir, block, total, static_cast<int>(batch), static_cast<int>(threads), tier));
  }
  std::printf(
      "disk tier: %lld MiB in %lld KiB blocks, batches of %lld, %lld I/O threads, "
      "median of %lld; GB/s = 1e9 bytes/s\n\n",
      static_cast<long long>(total >> 20), static_cast<long long>(block >> 10),
      static_cast<long long>(batch), static_cast<long long>(threads), static_cast<long long>(reps));
  std::printf("| path | write GB/s | read GB/s | block read p50 / p99 ms |\n");
  std::printf("|:--|--:|--:|--:|\n");
  std::printf("| sequential file, 8 MiB calls | %.2f | %.2f | - |\n", Median(seq.write_gbs),
              Median(seq.read_gbs));
  std::printf("| disk tier | %.2f (%.0f%%) | %.2f (%.0f%%) | %.2f / %.2f |\n",
              Median(tier.write_gbs), 100 * Median(tier.write_gbs) / Median(seq.write_gbs),
              Median(tier.read_gbs), 100 * Median(tier.read_gbs) / Median(seq.read_gbs),
              Quantile(tier.read_ms, 0.5), Quantile(tier.read_ms, 0.99));
  return absl::OkStatus();
}

}  // namespace
}  // namespace tandem::bench

int main(int argc, char** argv) {
  absl::Status s = tandem::bench::Main(argc, argv);
  if (!s.ok()) {
    std::fprintf(stderr, "disk-tier-bench: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
