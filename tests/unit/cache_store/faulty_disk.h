// A DiskFs over the real one that fails chosen operations: to crash a disk tier at any step of a
// write (the failing write tears: half its bytes land) and then reopen the directory as a
// restarted shard, or to make one step fail (a full disk) and let the rest succeed.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "cache_store/disk_io.h"

namespace tandem::cache_store {

class FaultyDiskFs final : public DiskFs {
 public:
  enum class Op { kWrite, kSync, kTruncate, kPreallocate, kReplace };
  // Given each mutating operation (numbered from 1, in order) and the file it touches: OK to let
  // it through, else its error. `crash` makes the first failure final: it and every later
  // mutating operation fail, as if the process had died there.
  using Fault = std::function<absl::Status(int64_t n, Op op, const std::string& path)>;

  explicit FaultyDiskFs(Fault fault = nullptr, bool crash = false)
      : fault_(std::move(fault)), crash_(crash) {}

  int64_t operations() const { return count_.load(); }

  // Whether operation `op` on `path` may proceed; OK, or the error to return.
  absl::Status Check(Op op, const std::string& path) {
    const int64_t n = ++count_;
    if (dead_.load()) return absl::UnavailableError("crashed");
    absl::Status s = fault_ ? fault_(n, op, path) : absl::OkStatus();
    if (!s.ok() && crash_) dead_.store(true);
    return s;
  }

  absl::StatusOr<std::unique_ptr<DiskFile>> Open(const std::string& path) override;
  absl::Status Replace(const std::string& from, const std::string& to) override {
    if (absl::Status s = Check(Op::kReplace, to); !s.ok()) return s;
    return PosixDiskFs().Replace(from, to);
  }
  absl::Status CreateDirectories(const std::string& path) override {
    return PosixDiskFs().CreateDirectories(path);
  }
  absl::Status Remove(const std::string& path) override { return PosixDiskFs().Remove(path); }

 private:
  Fault fault_;
  const bool crash_;
  std::atomic<int64_t> count_{0};
  std::atomic<bool> dead_{false};
};

class FaultyDiskFile final : public DiskFile {
 public:
  FaultyDiskFile(FaultyDiskFs& fs, std::unique_ptr<DiskFile> file, std::string path)
      : fs_(fs), file_(std::move(file)), path_(std::move(path)) {}

  absl::Status Write(std::span<const uint8_t> data, int64_t offset) override {
    if (absl::Status s = fs_.Check(FaultyDiskFs::Op::kWrite, path_); !s.ok()) {
      file_->Write(data.first(data.size() / 2), offset).IgnoreError();  // torn
      return s;
    }
    return file_->Write(data, offset);
  }
  absl::Status Read(std::span<uint8_t> data, int64_t offset) override {
    return file_->Read(data, offset);
  }
  absl::Status Sync() override {
    return Pass(FaultyDiskFs::Op::kSync, [&] { return file_->Sync(); });
  }
  absl::Status Truncate(int64_t size) override {
    return Pass(FaultyDiskFs::Op::kTruncate, [&] { return file_->Truncate(size); });
  }
  absl::Status Preallocate(int64_t size) override {
    return Pass(FaultyDiskFs::Op::kPreallocate, [&] { return file_->Preallocate(size); });
  }
  absl::StatusOr<int64_t> Size() override { return file_->Size(); }

 private:
  absl::Status Pass(FaultyDiskFs::Op op, const std::function<absl::Status()>& real) {
    if (absl::Status s = fs_.Check(op, path_); !s.ok()) return s;
    return real();
  }

  FaultyDiskFs& fs_;
  std::unique_ptr<DiskFile> file_;
  const std::string path_;
};

inline absl::StatusOr<std::unique_ptr<DiskFile>> FaultyDiskFs::Open(const std::string& path) {
  absl::StatusOr<std::unique_ptr<DiskFile>> file = PosixDiskFs().Open(path);
  if (!file.ok()) return file.status();
  return std::unique_ptr<DiskFile>(new FaultyDiskFile(*this, *std::move(file), path));
}

}  // namespace tandem::cache_store
