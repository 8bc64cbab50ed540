#include "common/util/huge_page_arena.h"

#include <cstring>

#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(HugePageArenaTest, AlignedDisjointZeroedAllocations) {
  HugePageArena arena;
  auto a = arena.Allocate(100);
  auto b = arena.Allocate(1000);
  auto big = arena.Allocate(size_t{300} << 20);  // larger than a chunk: its own mapping
  ASSERT_TRUE(a.ok() && b.ok() && big.ok());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(*a) % 64, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(*b) % 64, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(*big) % (2 << 20), 0u);
  EXPECT_GE(*b, *a + 100);
  EXPECT_EQ((*b)[999], 0);
  std::memset(*a, 0xab, 100);
  EXPECT_EQ((*b)[0], 0);
  (*big)[(size_t{300} << 20) - 1] = 7;
  EXPECT_GE(arena.reserved_bytes(), size_t{556} << 20);
}

}  // namespace
}  // namespace tandem
