#include "common/store/shm_mapping.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cache_store/shm_arena.h"
#include "common/store/shm_layout.h"
#include "tests/unit/testing/eventually.h"
#include "tests/unit/testing/sanitizers.h"

namespace tandem::store {
namespace {

TEST(ShmMappingTest, RegionsMustLieInTheBlockArea) {
  constexpr int64_t kMapped = kShmHeaderBytes + 8192;
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  EXPECT_TRUE(ValidateShmRegion(kShmHeaderBytes, 8192, kMapped).ok());
  EXPECT_TRUE(ValidateShmRegion(kMapped - 1, 1, kMapped).ok());
  struct Case {
    int64_t offset, size;
  };
  for (Case c : {Case{kShmHeaderBytes, 0},        // empty
                 Case{kShmHeaderBytes, -1},       // negative size
                 Case{-4096, 100},                // before the file
                 Case{0, 100},                    // the header
                 Case{kShmHeaderBytes - 1, 100},  // straddles the header
                 Case{kMapped - 100, 101},        // one past the end
                 Case{kMapped, 1},                // at the end
                 Case{kMapped + 4096, 1},         // beyond
                 Case{kShmHeaderBytes, kMax},     // overflows offset + size
                 Case{kMax - 10, 100},            // overflows too
                 Case{kMax, kMax}}) {
    EXPECT_EQ(ValidateShmRegion(c.offset, c.size, kMapped).code(),
              absl::StatusCode::kInvalidArgument)
        << c.offset << " +" << c.size;
  }
}

TEST(ShmMappingTest, LocalAddresses) {
  char host[256] = {};
  ASSERT_EQ(gethostname(host, sizeof(host) - 1), 0);
  // This machine's first non-loopback IPv4 address, if it has one.
  std::string own_ip;
  ifaddrs* list = nullptr;
  ASSERT_EQ(getifaddrs(&list), 0);
  for (ifaddrs* a = list; a != nullptr && own_ip.empty(); a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    char text[INET_ADDRSTRLEN] = {};
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, text, sizeof(text));
    if (std::string_view(text).substr(0, 4) != "127.") own_ip = text;
  }
  freeifaddrs(list);
  if (!own_ip.empty()) {
    EXPECT_TRUE(IsLocalAddress(own_ip + ":50051")) << own_ip;
  }
  for (const std::string& a :
       {std::string("127.0.0.1:5000"), std::string("127.1.2.3:1"), std::string("localhost:80"),
        std::string("LOCALHOST:80"), std::string("[::1]:9000"), std::string("::1"),
        std::string("ipv4:127.0.0.1:7"), std::string("dns:///localhost:7"),
        std::string("unix:/tmp/store.sock"), absl::StrCat(host, ":1234")}) {
    EXPECT_TRUE(IsLocalAddress(a)) << a;
  }
  for (const char* a : {"203.0.113.7:5000", "store-0.cluster.local:50051", "[2001:db8::1]:80",
                        "198.51.100.1", "", "dns:///store-1:7", "localhost.example.com:1"}) {
    EXPECT_FALSE(IsLocalAddress(a)) << a;
  }
}

TEST(ShmMappingTest, MapsARealArenaAndChecksItsRegions) {
  auto arena = cache_store::ShmArena::Create(1 << 20);
  ASSERT_TRUE(arena.ok()) << arena.status();
  auto mapping =
      ShmMapping::Open((*arena)->path(), (*arena)->file_bytes(), (*arena)->instance_id());
  ASSERT_TRUE(mapping.ok()) << mapping.status();
  std::memcpy((*arena)->data() + 100, "tandem", 6);
  auto region = (*mapping)->Region(kShmHeaderBytes + 100, 6);
  ASSERT_TRUE(region.ok());
  EXPECT_EQ(std::memcmp(region->data(), "tandem", 6), 0);  // the same pages
  EXPECT_FALSE((*mapping)->Region((*arena)->file_bytes() - 5, 6).ok());
  EXPECT_FALSE((*mapping)->Region(0, 6).ok());
}

TEST(ShmMappingTest, RefusesFilesThatAreNotTheArenaAttachedTo) {
  auto arena = cache_store::ShmArena::Create(1 << 20);
  ASSERT_TRUE(arena.ok());
  const std::string path = (*arena)->path();
  const int64_t bytes = (*arena)->file_bytes();
  const uint64_t id = (*arena)->instance_id();
  auto code = [](const absl::StatusOr<std::unique_ptr<ShmMapping>>& m) {
    return m.status().code();
  };
  EXPECT_EQ(code(ShmMapping::Open(path, bytes, id + 1)), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(code(ShmMapping::Open(path, bytes + 4096, id)), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(code(ShmMapping::Open(path, 0, id)), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(code(ShmMapping::Open("/etc/passwd", bytes, id)),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(code(ShmMapping::Open("/proc/self/fd/../../../etc/passwd", bytes, id)),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(code(ShmMapping::Open("/proc/self/fd/99999", bytes, id)),
            absl::StatusCode::kFailedPrecondition);

  // The right size and header, but the file can shrink under a mapping: refused.
  const int fd = memfd_create("unsealed", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, bytes), 0);
  ShmHeader header{.magic = kShmMagic, .instance_id = id, .file_bytes = bytes};
  ASSERT_EQ(pwrite(fd, &header, sizeof(header), 0), static_cast<ssize_t>(sizeof(header)));
  EXPECT_EQ(code(ShmMapping::Open(absl::StrCat("/proc/self/fd/", fd), bytes, id)),
            absl::StatusCode::kFailedPrecondition);
  close(fd);
}

// Page faults this thread has taken that needed no I/O: on a shared-memory arena, each first
// touch of a 4 KiB page by a process. Not counted under a sanitizer, whose shadow memory faults
// too (the release build's run checks the counts).
bool CountsFaults() { return !testing::kSanitized; }

int64_t MinorFaults() {
  rusage usage{};
  getrusage(RUSAGE_THREAD, &usage);
  return usage.ru_minflt;
}

// Pages of [data, data + bytes) the arena's file holds (allocated), by mincore.
int64_t ResidentPages(const uint8_t* data, int64_t bytes) {
  std::vector<unsigned char> resident(static_cast<size_t>(bytes / 4096));
  EXPECT_EQ(mincore(const_cast<uint8_t*>(data), static_cast<size_t>(bytes), resident.data()), 0);
  int64_t n = 0;
  for (unsigned char r : resident) n += r & 1;
  return n;
}

// Whether this kernel backs shared memory with 4 KiB pages only (shmem huge pages off), so that
// a first write takes a fault per 4 KiB.
bool ShmemSmallPagesOnly() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/shmem_enabled");
  std::stringstream text;
  text << f.rdbuf();
  return text.str().find("[never]") != std::string::npos ||
         text.str().find("[deny]") != std::string::npos;
}

constexpr int64_t kPreallocatedBytes = 16 << 20;
constexpr int64_t kPages = kPreallocatedBytes / 4096;

TEST(ShmMappingTest, APreallocatedArenaIsAllocatedAndMappedAtCreation) {
  for (bool preallocate : {false, true}) {
    SCOPED_TRACE(preallocate ? "preallocated" : "allocated on first write");
    auto arena = cache_store::ShmArena::Create(kPreallocatedBytes, preallocate);
    ASSERT_TRUE(arena.ok()) << arena.status();
    EXPECT_EQ((*arena)->preallocated(), preallocate);
    const int64_t resident = ResidentPages((*arena)->data(), kPreallocatedBytes);
    const int64_t before = MinorFaults();
    std::memset((*arena)->data(), 0x5a, kPreallocatedBytes);
    const int64_t faults = MinorFaults() - before;
    if (preallocate) {
      EXPECT_EQ(resident, kPages);
      if (CountsFaults()) EXPECT_LT(faults, 16) << "of " << kPages << " pages";
    } else {
      EXPECT_EQ(resident, 0);
      if (CountsFaults() && ShmemSmallPagesOnly()) EXPECT_GE(faults, kPages / 2);
    }
  }
}

TEST(ShmMappingTest, AClientMapsAPreallocatedArenaInTheBackground) {
  auto arena = cache_store::ShmArena::Create(kPreallocatedBytes, /*preallocate=*/true);
  ASSERT_TRUE(arena.ok()) << arena.status();
  auto open = [&] {
    return ShmMapping::Open((*arena)->path(), (*arena)->file_bytes(), (*arena)->instance_id());
  };
  // Blocks written through the mapping, as a worker's put writes them.
  const std::vector<uint8_t> bytes(kPreallocatedBytes / 4, 0x33);
  std::vector<ArenaRegion> regions;
  for (int64_t i = 0; i < 4; ++i) {
    regions.push_back({.index = static_cast<uint32_t>(i),
                       .offset = kShmHeaderBytes + i * (kPreallocatedBytes / 4),
                       .length = kPreallocatedBytes / 4,
                       .bytes = bytes});
  }
  for (bool populate : {false, true}) {
    SCOPED_TRACE(populate ? "mapped in the background" : "mapped on first write");
    auto mapping = open();
    ASSERT_TRUE(mapping.ok()) << mapping.status();
    if (populate) {
      (*mapping)->PopulateInBackground();
      ASSERT_TRUE(testing::Eventually([&] { return (*mapping)->populated(); }));
    }
    const int64_t before = MinorFaults();
    ASSERT_TRUE((*mapping)->Write({}, regions).ok());
    const int64_t faults = MinorFaults() - before;
    if (CountsFaults() && populate) EXPECT_LT(faults, 16) << "of " << kPages << " pages";
    if (CountsFaults() && !populate && ShmemSmallPagesOnly()) EXPECT_GE(faults, kPages / 2);
    EXPECT_EQ(std::memcmp((*arena)->data(), bytes.data(), bytes.size()), 0);
  }
  // A mapping closed while it populates stops it first (sanitizers watch the unmapping).
  auto closing = open();
  ASSERT_TRUE(closing.ok());
  (*closing)->PopulateInBackground();
  closing->reset();
}

}  // namespace
}  // namespace tandem::store
