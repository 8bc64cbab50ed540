#include "common/store/shm_mapping.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/store/block_checksum.h"
#include "common/store/shm_layout.h"
#include "common/util/log.h"
#include "common/util/populate.h"

namespace tandem::store {
namespace {

constexpr int64_t kMaxFileBytes = int64_t{1} << 40;

// The host part of a gRPC target: "dns:///h:1", "ipv4:h:1", "[::1]:1", "h:1", "h".
std::string_view HostOf(std::string_view target) {
  for (std::string_view scheme : {"dns:///", "dns:", "ipv4:", "ipv6:"}) {
    if (target.starts_with(scheme)) {
      target.remove_prefix(scheme.size());
      break;
    }
  }
  if (target.starts_with("[")) {
    const size_t end = target.find(']');
    return end == std::string_view::npos ? std::string_view() : target.substr(1, end - 1);
  }
  const size_t colon = target.find(':');
  if (colon != std::string_view::npos && target.find(':', colon + 1) == std::string_view::npos) {
    return target.substr(0, colon);  // one colon: host:port; more: a bare IPv6 address
  }
  return target;
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = absl::ascii_tolower(static_cast<unsigned char>(c));
  return out;
}

// Whether `host` is the numeric address of one of this machine's interfaces.
bool IsInterfaceAddress(const std::string& host) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return false;
  bool found = false;
  for (ifaddrs* a = list; a != nullptr && !found; a = a->ifa_next) {
    if (a->ifa_addr == nullptr) continue;
    char text[INET6_ADDRSTRLEN] = {};
    if (a->ifa_addr->sa_family == AF_INET) {
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, text,
                sizeof(text));
    } else if (a->ifa_addr->sa_family == AF_INET6) {
      inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(a->ifa_addr)->sin6_addr, text,
                sizeof(text));
    }
    found = text[0] != '\0' && host == text;
  }
  freeifaddrs(list);
  return found;
}

}  // namespace

absl::Status ValidateShmRegion(int64_t offset, int64_t size, int64_t mapped_bytes) {
  if (size <= 0 || offset < kShmHeaderBytes || offset > mapped_bytes ||
      size > mapped_bytes - offset) {
    return absl::InvalidArgumentError(absl::StrCat("shared memory: region [", offset, ", +", size,
                                                   ") is outside the ", mapped_bytes,
                                                   "-byte arena"));
  }
  return absl::OkStatus();
}

bool IsLocalAddress(std::string_view address) {
  if (address.starts_with("unix:") || address.starts_with("unix-abstract:")) {
    return true;
  }
  const std::string host = Lower(HostOf(address));
  if (host.empty()) return false;
  if (host == "localhost" || host == "::1" || host == "0.0.0.0" || host == "::" ||
      host.starts_with("127.") || host.ends_with(".localhost")) {
    return true;
  }
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) == 0 && host == Lower(name)) return true;
  return IsInterfaceAddress(host);
}

absl::StatusOr<std::unique_ptr<ShmMapping>> ShmMapping::Open(const std::string& path,
                                                             int64_t file_bytes,
                                                             uint64_t instance_id) {
  if (file_bytes <= kShmHeaderBytes || file_bytes > kMaxFileBytes) {
    return absl::FailedPreconditionError(
        absl::StrCat("shared memory: implausible arena size ", file_bytes));
  }
  // Only where arenas live: a shard must not make its clients open arbitrary files or devices.
  if (!(path.starts_with("/proc/") || path.starts_with("/dev/shm/")) ||
      path.find("..") != std::string::npos) {
    return absl::FailedPreconditionError(absl::StrCat("shared memory: refusing path ", path));
  }
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("shared memory: open ", path, ": ", std::strerror(errno)));
  }
  struct stat st = {};
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0 || fstat(fd, &st) != 0 || st.st_size < file_bytes) {
    close(fd);
    return absl::FailedPreconditionError(absl::StrCat(
        "shared memory: ", path, " is not a size-sealed arena of ", file_bytes, " bytes"));
  }
  void* base = mmap(nullptr, file_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);  // the mapping keeps the file
  if (base == MAP_FAILED) {
    return absl::FailedPreconditionError(
        absl::StrCat("shared memory: mmap ", path, ": ", std::strerror(errno)));
  }
  madvise(base, file_bytes, MADV_HUGEPAGE);
  std::unique_ptr<ShmMapping> mapping(
      new ShmMapping(static_cast<uint8_t*>(base), file_bytes, instance_id));
  ShmHeader header;
  std::memcpy(&header, base, sizeof(header));
  if (header.magic != kShmMagic || header.instance_id != instance_id ||
      header.file_bytes != file_bytes) {
    return absl::FailedPreconditionError(
        absl::StrCat("shared memory: ", path, " is not the arena of shard instance ", instance_id));
  }
  return mapping;
}

ShmMapping::~ShmMapping() {
  if (populator_.joinable()) {
    stop_populating_.store(true, std::memory_order_relaxed);
    populator_.join();
  }
  munmap(base_, size_);
}

void ShmMapping::PopulateInBackground() {
  if (populator_.joinable()) return;
  populator_ = std::thread([this] {
    const auto start = std::chrono::steady_clock::now();
    const absl::Status s = PopulateWritable(base_, size_, &stop_populating_);
    if (s.ok()) {
      populated_.store(true, std::memory_order_release);
      Log(LogLevel::kInfo, "cache-store-client",
          absl::StrCat("shared memory: mapped the shard's preallocated ", size_ >> 20,
                       " MiB arena in ",
                       std::chrono::duration_cast<std::chrono::milliseconds>(
                           std::chrono::steady_clock::now() - start)
                           .count(),
                       " ms"));
    } else if (!absl::IsCancelled(s)) {
      Log(LogLevel::kWarning, "cache-store-client",
          absl::StrCat(s.ToString(), "; first writes to blocks will fault pages in"));
    }
  });
}

absl::StatusOr<std::span<uint8_t>> ShmMapping::Region(int64_t offset, int64_t size) const {
  if (absl::Status s = ValidateShmRegion(offset, size, size_); !s.ok()) return s;
  return std::span<uint8_t>(base_ + offset, static_cast<size_t>(size));
}

absl::StatusOr<std::vector<uint64_t>> ShmMapping::Write(const LeaseGrant&,
                                                        std::span<const ArenaRegion> regions) {
  std::vector<uint64_t> checksums;
  checksums.reserve(regions.size());
  for (const ArenaRegion& r : regions) {
    absl::StatusOr<std::span<uint8_t>> region = Region(r.offset, r.length);
    if (!region.ok()) return region.status();
    if (r.bytes.size() != region->size()) {
      return absl::InvalidArgumentError("shared memory: a block and its region differ in size");
    }
    checksums.push_back(CopyWithChecksum64(*region, r.bytes));
  }
  return checksums;
}

absl::StatusOr<std::vector<uint64_t>> ShmMapping::Read(const LeaseGrant&,
                                                       std::span<const ArenaRegion> regions,
                                                       std::span<std::string> out) {
  std::vector<uint64_t> checksums;
  checksums.reserve(regions.size());
  for (size_t i = 0; i < regions.size(); ++i) {
    absl::StatusOr<std::span<uint8_t>> region = Region(regions[i].offset, regions[i].length);
    if (!region.ok()) return region.status();
    out[i].clear();
    checksums.push_back(AppendWithChecksum64(out[i], *region));
  }
  return checksums;
}

}  // namespace tandem::store
