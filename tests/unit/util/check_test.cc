// TANDEM_CHECK stays on in Release builds (this test runs in the Release CI build): a failed
// check logs the condition, the place and the message, then aborts.
#include "common/util/check.h"

#include <gtest/gtest.h>

namespace tandem {
namespace {

TEST(CheckDeathTest, AFailedCheckLogsWhereAndWhyThenAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const int refs = 0;
  EXPECT_DEATH(TANDEM_CHECK(refs > 0, "releasing a block nobody holds"),
               "check_test.cc:[0-9]+: refs > 0 failed: releasing a block nobody holds");
}

TEST(CheckDeathTest, AHoldingCheckDoesNothing) {
  int evaluated = 0;
  TANDEM_CHECK(++evaluated == 1, "evaluated once");
  EXPECT_EQ(evaluated, 1);
}

}  // namespace
}  // namespace tandem
