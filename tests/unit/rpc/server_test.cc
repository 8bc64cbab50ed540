#include "common/rpc/server.h"

#include <gtest/gtest.h>

namespace tandem::rpc {
namespace {

TEST(AdvertisedAddressTest, EmptyMeansTheBoundAddress) {
  EXPECT_EQ(AdvertisedAddress("", "0.0.0.0:7100"), "0.0.0.0:7100");
}

TEST(AdvertisedAddressTest, HostPortIsKept) {
  EXPECT_EQ(AdvertisedAddress("10.0.0.7:7101", "0.0.0.0:7100"), "10.0.0.7:7101");
  EXPECT_EQ(AdvertisedAddress("worker-0.tandem:7100", "0.0.0.0:7100"), "worker-0.tandem:7100");
  EXPECT_EQ(AdvertisedAddress("[fd00::7]:7101", "0.0.0.0:7100"), "[fd00::7]:7101");
}

TEST(AdvertisedAddressTest, HostAloneTakesTheBoundPort) {
  EXPECT_EQ(AdvertisedAddress("10.0.0.7", "0.0.0.0:7100"), "10.0.0.7:7100");
  EXPECT_EQ(AdvertisedAddress("worker-0.tandem", "[::]:7200"), "worker-0.tandem:7200");
}

TEST(AdvertisedAddressTest, BareIpv6LiteralGetsBracketsAndThePort) {
  EXPECT_EQ(AdvertisedAddress("fd00::7", "0.0.0.0:7100"), "[fd00::7]:7100");
  EXPECT_EQ(AdvertisedAddress("2001:db8::1:2", "[::]:7200"), "[2001:db8::1:2]:7200");
  EXPECT_EQ(AdvertisedAddress("::1", "127.0.0.1:43211"), "[::1]:43211");
}

}  // namespace
}  // namespace tandem::rpc
