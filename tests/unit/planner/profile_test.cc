#include "common/planner/profile.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::planner {
namespace {

using ::testing::HasSubstr;

// Steps of a known engine: prefill 1 ms + 0.1 ms a token + 1 us per key read, decode 2 ms +
// 0.5 ms a sequence + 10 ns per cached token.
double TruePrefill(int64_t tokens, int64_t context) {
  return 1e-3 + 1e-4 * tokens + 1e-6 * StepModel::PrefillWork(tokens, context);
}
double TrueDecode(int64_t batch, int64_t context) { return 2e-3 + 5e-4 * batch + 1e-8 * context; }

EngineProfile KnownProfile() {
  EngineProfile p;
  p.machine = "test";
  p.threads = 2;
  p.model = "m";
  p.num_layers = 4;
  p.pop_start_layer = 4;
  p.token_overhead_seconds = 1.25e-4;
  p.shared_overhead_seconds = 1.5e-4;
  p.shared_step_overhead_seconds = 8e-5;
  p.handoff_overhead_seconds = 0.009;
  p.import_overhead_seconds = 0.004;
  p.kv_bytes_per_token = 1024;
  p.block_size = 16;
  for (int64_t tokens : {16, 64, 256}) {
    for (int64_t context : {0, 256, 1024}) {
      p.prefill.push_back({tokens, context, TruePrefill(tokens, context)});
    }
  }
  for (int64_t batch : {1, 4, 16}) {
    for (int64_t context : {64 * batch, 1024 * batch}) {
      p.decode.push_back({batch, context, TrueDecode(batch, context)});
    }
  }
  p.transfer = {{"shm", 1 << 20, 1e-3}, {"shm", 1 << 16, 1e-4}, {"grpc", 1 << 20, 4e-3}};
  return p;
}

TEST(EngineProfileTest, RoundTripsThroughJson) {
  const EngineProfile p = KnownProfile();
  auto back = EngineProfile::FromJson(p.ToJson(), "p.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->threads, 2);
  EXPECT_EQ(back->kv_bytes_per_token, 1024);
  ASSERT_EQ(back->prefill.size(), p.prefill.size());
  ASSERT_EQ(back->decode.size(), p.decode.size());
  EXPECT_EQ(back->decode[3].tokens, p.decode[3].tokens);
  EXPECT_EQ(back->decode[3].context, p.decode[3].context);
  EXPECT_DOUBLE_EQ(back->decode[3].seconds, p.decode[3].seconds);
  ASSERT_EQ(back->transfer.size(), 3u);
  EXPECT_EQ(back->transfer[2].transport, "grpc");
  EXPECT_DOUBLE_EQ(back->token_overhead_seconds, 1.25e-4);
  EXPECT_DOUBLE_EQ(back->shared_overhead_seconds, 1.5e-4);
  EXPECT_DOUBLE_EQ(back->shared_step_overhead_seconds, 8e-5);
  EXPECT_DOUBLE_EQ(back->handoff_overhead_seconds, 0.009);
  EXPECT_DOUBLE_EQ(back->import_overhead_seconds, 0.004);
}

// Samples of a linear engine are fitted exactly, between and beyond the measured sizes.
TEST(StepModelTest, RecoversALinearEngine) {
  const EngineProfile p = KnownProfile();
  auto prefill = StepModel::Fit(p.prefill, true, "p");
  auto decode = StepModel::Fit(p.decode, false, "p");
  ASSERT_TRUE(prefill.ok() && decode.ok());
  EXPECT_NEAR(prefill->per_work(), 1e-6, 1e-12);
  EXPECT_NEAR(decode->per_work(), 1e-8, 1e-14);
  for (int64_t tokens : {16, 100, 256, 512}) {
    EXPECT_NEAR(prefill->Seconds(tokens, StepModel::PrefillWork(tokens, 300)),
                TruePrefill(tokens, 300), 1e-9)
        << tokens;
  }
  for (int64_t batch : {1, 3, 16, 40}) {
    EXPECT_NEAR(decode->Seconds(batch, 500.0 * batch), TrueDecode(batch, 500 * batch), 1e-9)
        << batch;
  }
}

TEST(StepModelTest, NoisySlopesAreNeverNegative) {
  // Within the group, more work took less time: the slope is clamped to 0, not fitted negative.
  auto m = StepModel::Fit({{8, 0, 2e-3}, {8, 1000, 1e-3}}, false, "p");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->per_work(), 0);
  EXPECT_NEAR(m->Seconds(8, 0), 1.5e-3, 1e-12);
}

TEST(EngineProfileTest, TransferInterpolatesAndScales) {
  const EngineProfile p = KnownProfile();
  EXPECT_NEAR(*TransferSeconds(p, "shm", 1 << 20), 1e-3, 1e-12);
  EXPECT_NEAR(*TransferSeconds(p, "shm", 4 << 20), 4e-3, 1e-12);  // at the largest's rate
  const double mid = *TransferSeconds(p, "shm", (1 << 16) + ((1 << 20) - (1 << 16)) / 2);
  EXPECT_NEAR(mid, 5.5e-4, 1e-12);
  EXPECT_EQ(TransferSeconds(p, "ucx", 1).status().code(), absl::StatusCode::kNotFound);
}

// The handoff is planned on the samples of the transport the workers take.
TEST(EngineProfileTest, TheHandoffIsPlannedOnTheConfiguredTransport) {
  EngineProfile p = KnownProfile();
  bool fell_back = true;
  EXPECT_EQ(PlannedTransport(p, "auto", true, &fell_back), "shm");
  EXPECT_FALSE(fell_back);
  EXPECT_EQ(PlannedTransport(p, "shm", true), "shm");
  EXPECT_EQ(PlannedTransport(p, "auto", false), "grpc");
  EXPECT_EQ(PlannedTransport(p, "shm", false), "grpc");
  EXPECT_EQ(PlannedTransport(p, "grpc", true), "grpc");
  EXPECT_EQ(PlannedTransport(p, "ucx", true, &fell_back), "grpc");  // no ucx samples
  EXPECT_TRUE(fell_back);
  p.transfer.push_back({"ucx", 1 << 20, 2e-3});
  EXPECT_EQ(PlannedTransport(p, "ucx", true, &fell_back), "ucx");
  EXPECT_FALSE(fell_back);
  EXPECT_NEAR(*TransferSeconds(p, "ucx", 2 << 20), 4e-3, 1e-12);
  // ucx samples survive the file.
  auto again = EngineProfile::FromJson(p.ToJson(), "p.json");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(PlannedTransport(*again, "ucx", false), "ucx");
}

TEST(EngineProfileTest, MalformedFilesAreClearErrors) {
  const std::string good = KnownProfile().ToJson();
  auto with = [&](const std::string& from, const std::string& to) {
    std::string text = good;
    const size_t at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return text.replace(at, from.size(), to);
  };
  struct Case {
    std::string text, message;
  };
  const Case cases[] = {
      {"[]", "object"},
      {"{}", "\"format\" is missing"},
      {with("tandem-engine-profile", "other"), "expected \"tandem-engine-profile\""},
      {with("\"version\": 1", "\"version\": 2"), "reads version 1"},
      {with("\"kv_bytes_per_token\": 1024", "\"kv_bytes_per_token\": -1"), "kv_bytes_per_token"},
      {with("\"seconds\": 0.0", "\"seconds\": -1"), "seconds"},
      {with("\"transport\": \"grpc\"", "\"transport\": \"tcp\""), "expected grpc, shm or ucx"},
      {with("\"prefill\": [", "\"prefill\": [7, "), "prefill[0] must be an object"},
      {with("\"pop_start_layer\": 4", "\"pop_start_layer\": 9"), "pop_start_layer"},
      {with("\"handoff_overhead_seconds\": 0.009", "\"handoff_overhead_seconds\": 2"),
       "handoff_overhead_seconds"},
      {with("\"shared_overhead_seconds\": 0.00015", "\"shared_overhead_seconds\": -1"),
       "shared_overhead_seconds"},
  };
  for (const Case& c : cases) {
    auto p = EngineProfile::FromJson(c.text, "p.json");
    ASSERT_FALSE(p.ok()) << c.message;
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(p.status().message(), HasSubstr(c.message));
  }
  // A profile without decode samples cannot drive a simulation.
  EngineProfile empty = KnownProfile();
  empty.decode.clear();
  auto p = EngineProfile::FromJson(empty.ToJson(), "p.json");
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(p.status().message(), HasSubstr("no decode samples"));
}

}  // namespace
}  // namespace tandem::planner
