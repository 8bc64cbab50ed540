#include "tools/tandem/serve_layout.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace tandem::cli {
namespace {

using ::testing::HasSubstr;

config::TandemConfig Config(const std::string& mode, const std::string& prefill_device = "",
                            const std::string& decode_device = "") {
  config::TandemConfig c;
  c.serve.mode = mode;
  c.serve.prefill_device = prefill_device;
  c.serve.decode_device = decode_device;
  return c;
}

TEST(ServeLayoutTest, AutoColocatesPhasesThatWouldShareADevice) {
  for (const auto& [prefill, decode] : std::vector<std::pair<std::string, std::string>>{
           {"", ""}, {"cpu", ""}, {"cuda", "cuda:0"}, {"cuda:1", "cuda:1"}}) {
    auto layout = ChooseServeLayout(Config("auto", prefill, decode));
    ASSERT_TRUE(layout.ok()) << layout.status();
    EXPECT_TRUE(layout->colocated) << prefill << " " << decode;
    EXPECT_THAT(layout->why, HasSubstr("would share"));
  }
}

TEST(ServeLayoutTest, AutoDisaggregatesPhasesOnDevicesOfTheirOwn) {
  for (const auto& [prefill, decode] : std::vector<std::pair<std::string, std::string>>{
           {"cuda:0", "cuda:1"}, {"cuda", "cpu"}, {"cpu", "cuda:0"}}) {
    auto layout = ChooseServeLayout(Config("auto", prefill, decode));
    ASSERT_TRUE(layout.ok()) << layout.status();
    EXPECT_FALSE(layout->colocated) << prefill << " " << decode;
    EXPECT_THAT(layout->why, HasSubstr("each have a device"));
  }
  // model.device fills in the phase without its own.
  config::TandemConfig c = Config("auto", "cuda:1");
  c.model.device = "cuda:0";
  auto layout = ChooseServeLayout(c);
  ASSERT_TRUE(layout.ok());
  EXPECT_FALSE(layout->colocated);
  EXPECT_EQ(layout->decode_device.ToString(), "cuda:0");
  EXPECT_EQ(layout->prefill_device.ToString(), "cuda:1");
}

// Prefill-only pruning needs prefill workers.
TEST(ServeLayoutTest, AutoDisaggregatesWhenPrefillPrunes) {
  config::TandemConfig c = Config("auto");
  c.kv_cache_optimization.enabled = true;
  auto layout = ChooseServeLayout(c);
  ASSERT_TRUE(layout.ok());
  EXPECT_FALSE(layout->colocated);
  EXPECT_THAT(layout->why, HasSubstr("kv_cache_optimization"));
}

TEST(ServeLayoutTest, AnExplicitModeIsKeptAndSaysSo) {
  auto d = ChooseServeLayout(Config("disaggregated"));
  ASSERT_TRUE(d.ok());
  EXPECT_FALSE(d->colocated);
  EXPECT_EQ(d->why, "serve.mode=disaggregated");
  auto c = ChooseServeLayout(Config("colocated", "cuda:0", "cuda:1"));
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->colocated);
  EXPECT_EQ(c->why, "serve.mode=colocated");
  config::TandemConfig router_colocated = Config("auto", "cuda:0", "cuda:1");
  router_colocated.router.mode = "colocated";
  auto r = ChooseServeLayout(router_colocated);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->colocated);
}

TEST(ServeLayoutTest, ContradictionsAndBadDevicesAreInvalidArguments) {
  config::TandemConfig c = Config("disaggregated");
  c.router.mode = "colocated";
  auto layout = ChooseServeLayout(c);
  EXPECT_EQ(layout.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(layout.status().message(), HasSubstr("router.mode colocated"));
  auto bad = ChooseServeLayout(Config("auto", "gpu"));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("\"gpu\""));
}

// The same inputs, the same answer.
TEST(ServeLayoutTest, Deterministic) {
  for (int i = 0; i < 3; ++i) {
    auto a = ChooseServeLayout(Config("auto", "cuda:0", "cuda:1"));
    auto b = ChooseServeLayout(Config("auto", "cuda:0", "cuda:1"));
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a->colocated, b->colocated);
    EXPECT_EQ(a->why, b->why);
  }
}

}  // namespace
}  // namespace tandem::cli
