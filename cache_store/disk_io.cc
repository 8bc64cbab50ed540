#include "cache_store/disk_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"

namespace tandem::cache_store {
namespace {

absl::Status ErrnoStatus(int err, const std::string& what) {
  const std::string message = absl::StrCat(what, ": ", std::strerror(err));
  if (err == ENOSPC || err == EDQUOT) return absl::ResourceExhaustedError(message);
  if (err == ENOENT) return absl::NotFoundError(message);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(message);
  return absl::InternalError(message);
}

class PosixFile final : public DiskFile {
 public:
  PosixFile(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  ~PosixFile() override { ::close(fd_); }

  absl::Status Write(std::span<const uint8_t> data, int64_t offset) override {
    size_t done = 0;
    while (done < data.size()) {
      const ssize_t n = ::pwrite(fd_, data.data() + done, data.size() - done,
                                 static_cast<off_t>(offset + static_cast<int64_t>(done)));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return ErrnoStatus(n < 0 ? errno : ENOSPC, absl::StrCat("write ", path_));
      done += static_cast<size_t>(n);
    }
    return absl::OkStatus();
  }

  absl::Status Read(std::span<uint8_t> data, int64_t offset) override {
    size_t done = 0;
    while (done < data.size()) {
      const ssize_t n = ::pread(fd_, data.data() + done, data.size() - done,
                                static_cast<off_t>(offset + static_cast<int64_t>(done)));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return ErrnoStatus(errno, absl::StrCat("read ", path_));
      if (n == 0) {
        return absl::OutOfRangeError(
            absl::StrCat("read ", path_, ": ends before ", offset + data.size()));
      }
      done += static_cast<size_t>(n);
    }
    return absl::OkStatus();
  }

  absl::Status Sync() override {
    if (::fdatasync(fd_) != 0) return ErrnoStatus(errno, absl::StrCat("fdatasync ", path_));
    return absl::OkStatus();
  }

  absl::Status Truncate(int64_t size) override {
    if (::ftruncate(fd_, static_cast<off_t>(size)) != 0) {
      return ErrnoStatus(errno, absl::StrCat("truncate ", path_));
    }
    return absl::OkStatus();
  }

  absl::Status Preallocate(int64_t size) override {
    // posix_fallocate returns the error instead of setting errno.
    if (const int err = ::posix_fallocate(fd_, 0, static_cast<off_t>(size)); err != 0) {
      return ErrnoStatus(err, absl::StrCat("preallocate ", size, " bytes for ", path_));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<int64_t> Size() override {
    struct stat st;
    if (::fstat(fd_, &st) != 0) return ErrnoStatus(errno, absl::StrCat("stat ", path_));
    return static_cast<int64_t>(st.st_size);
  }

 private:
  const int fd_;
  const std::string path_;
};

class PosixFs final : public DiskFs {
 public:
  absl::StatusOr<std::unique_ptr<DiskFile>> Open(const std::string& path) override {
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) return ErrnoStatus(errno, absl::StrCat("open ", path));
    return std::make_unique<PosixFile>(fd, path);
  }

  absl::Status Replace(const std::string& from, const std::string& to) override {
    if (std::rename(from.c_str(), to.c_str()) != 0) {
      return ErrnoStatus(errno, absl::StrCat("rename ", from, " to ", to));
    }
    const std::string dir = std::filesystem::path(to).parent_path().string();
    const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return ErrnoStatus(errno, absl::StrCat("open ", dir));
    const int rc = ::fsync(fd);
    const int err = errno;
    ::close(fd);
    if (rc != 0) return ErrnoStatus(err, absl::StrCat("fsync ", dir));
    return absl::OkStatus();
  }

  absl::Status CreateDirectories(const std::string& path) override {
    std::error_code ec;
    std::filesystem::create_directories(path, ec);
    if (ec) return ErrnoStatus(ec.value(), absl::StrCat("create directory ", path));
    return absl::OkStatus();
  }

  absl::Status Remove(const std::string& path) override {
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      return ErrnoStatus(errno, absl::StrCat("remove ", path));
    }
    return absl::OkStatus();
  }
};

}  // namespace

DiskFs& PosixDiskFs() {
  static PosixFs* fs = new PosixFs();
  return *fs;
}

}  // namespace tandem::cache_store
