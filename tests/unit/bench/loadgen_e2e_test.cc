// The load generator against a real gRPC server on loopback (a fake Inference service).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <fstream>
#include <numeric>

#include "bench/serving/bench_command.h"
#include "bench/serving/load_client.h"
#include "common/util/file_util.h"
#include "nlohmann/json.hpp"
#include "tests/unit/bench/args.h"
#include "tests/unit/bench/fake_inference.h"
#include "tests/unit/testing/serving.h"

namespace tandem::bench {
namespace {

using testing::BenchArgs;
using testing::FakeInference;
using testing::FakeInferenceOptions;
using ::testing::HasSubstr;

class LoadgenTest : public ::testing::Test {
 protected:
  void Start(FakeInferenceOptions options = {}) {
    fake_ = std::make_unique<FakeInference>(std::move(options));
    server_ = tandem::testing::ServeOnLoopback(fake_.get(), &addr_);
    ASSERT_NE(server_, nullptr);
  }
  void TearDown() override {
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  }

  // Runs `tandem bench --addr ADDR --progress=false --json-out FILE <words>`; the JSON report
  // lands in `*report` when one was written.
  absl::Status Bench(std::vector<std::string> words, nlohmann::json* report) {
    const std::string path = ::testing::TempDir() + "/loadgen_" +
                             ::testing::UnitTest::GetInstance()->current_test_info()->name() +
                             ".json";
    std::remove(path.c_str());
    words.insert(words.end(), {"--addr", addr_, "--progress=false", "--json-out", path});
    auto args = BenchArgs(words);
    if (!args.ok()) return args.status();
    absl::Status status = RunBenchCommand(*args);
    auto text = ReadFileToString(path);
    if (text.ok()) *report = nlohmann::json::parse(*text);
    return status;
  }

  std::unique_ptr<FakeInference> fake_;
  std::unique_ptr<grpc::Server> server_;
  std::string addr_;
};

TEST_F(LoadgenTest, EveryRequestSucceedsWithTheRightTokenCounts) {
  Start({.vocab_size = 37});
  nlohmann::json r;
  ASSERT_TRUE(Bench({"--num-requests", "50", "--input-len", "16", "--output-len", "8",
                     "--request-rate", "inf", "--seed", "1"},
                    &r)
                  .ok());
  EXPECT_EQ(r["completed"], 50);
  EXPECT_EQ(r["failed"], 0);
  EXPECT_EQ(r["total_input_tokens"], 50 * 16);
  EXPECT_EQ(r["total_output_tokens"], 50 * 8);
  EXPECT_EQ(r["ttft_ms"]["count"], 50);
  EXPECT_EQ(r["tpot_ms"]["count"], 50);
  EXPECT_EQ(r["itl_ms"]["count"], 50 * 7);  // one-token chunks: 7 gaps after the first
  EXPECT_EQ(r["e2e_ms"]["count"], 50);
  EXPECT_EQ(r["config"]["model"], "fake-model");
  EXPECT_GT(r["output_throughput"].get<double>(), 0);
  EXPECT_FALSE(r.contains("goodput"));
  // The prompts the server saw: random ids below the model's vocabulary, as asked.
  std::vector<tandem::v1::GenerateRequest> seen = fake_->requests();
  ASSERT_EQ(seen.size(), 50u);
  for (const auto& request : seen) {
    EXPECT_TRUE(request.prompt().empty());
    ASSERT_EQ(request.prompt_token_ids_size(), 16);
    for (int32_t id : request.prompt_token_ids()) ASSERT_TRUE(id >= 0 && id < 37) << id;
    EXPECT_EQ(request.sampling().max_tokens(), 8);
    EXPECT_TRUE(request.sampling().ignore_eos());
  }
}

TEST_F(LoadgenTest, RejectedRequestsAreCountedWithTheirCode) {
  Start({.fail_every = 3});
  nlohmann::json r;
  ASSERT_TRUE(Bench({"--num-requests", "30", "--input-len", "4", "--output-len", "5",
                     "--slo-ttft-ms", "60000"},
                    &r)
                  .ok());
  EXPECT_EQ(r["num_requests"], 30);
  EXPECT_EQ(r["completed"], 20);
  EXPECT_EQ(r["failed"], 10);
  EXPECT_EQ(r["failures_by_code"], nlohmann::json({{"RESOURCE_EXHAUSTED", 10}}));
  EXPECT_THAT(r["first_error"].get<std::string>(), HasSubstr("fake queue is full"));
  EXPECT_EQ(r["total_output_tokens"], 20 * 5);
  EXPECT_EQ(r["ttft_ms"]["count"], 20);
  EXPECT_EQ(r["good_requests"], 20);  // failures never count as good
}

TEST_F(LoadgenTest, DatasetPromptsAreSentAsTextWithTheirMaxTokens) {
  Start();
  const std::string path = ::testing::TempDir() + "/loadgen_dataset.jsonl";
  std::ofstream(path) << "{\"prompt\": \"Once upon\", \"max_tokens\": 3}\n"
                      << "{\"prompt\": \"def f():\", \"max_tokens\": 6}\n";
  nlohmann::json r;
  ASSERT_TRUE(Bench({"--dataset", path, "--num-requests", "5"}, &r).ok());
  EXPECT_EQ(r["completed"], 5);
  EXPECT_EQ(r["total_output_tokens"], 3 + 6 + 3 + 6 + 3);
  std::vector<std::string> prompts;
  for (const auto& request : fake_->requests()) prompts.push_back(request.prompt());
  std::sort(prompts.begin(), prompts.end());
  EXPECT_EQ(prompts, (std::vector<std::string>{"Once upon", "Once upon", "Once upon",
                                               "def f():", "def f():"}));
}

// A Mooncake-format trace: prompts made from its lengths and block ids (shared ids, shared
// prefix), sent at its timestamps scaled to --request-rate (600 ms recorded, 150 ms at 4x).
TEST_F(LoadgenTest, TracesAreReplayedOnTheirScaledTimestamps) {
  Start({.vocab_size = 37});
  const std::string path = ::testing::TempDir() + "/loadgen_trace.jsonl";
  std::ofstream(path)
      << "{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 2, \"hash_ids\": [1, 2]}\n"
      << "{\"timestamp\": 0, \"input_length\": 520, \"output_length\": 3, \"hash_ids\": [1, 3]}\n"
      << "{\"timestamp\": 300, \"input_length\": 10, \"output_length\": 2}\n"
      << "{\"timestamp\": 600, \"input_length\": 10, \"output_length\": 2}\n";
  nlohmann::json r;
  ASSERT_TRUE(Bench({"--dataset", path, "--request-rate", "20"}, &r).ok());  // recorded: 5/s
  EXPECT_EQ(r["completed"], 4);
  EXPECT_EQ(r["total_input_tokens"], 600 + 520 + 10 + 10);
  EXPECT_EQ(r["total_output_tokens"], 2 + 3 + 2 + 2);
  EXPECT_GE(r["duration_s"].get<double>(), 0.15);
  EXPECT_LT(r["duration_s"].get<double>(), 0.6);
  std::vector<tandem::v1::GenerateRequest> seen = fake_->requests();
  ASSERT_EQ(seen.size(), 4u);
  const tandem::v1::GenerateRequest* first = nullptr;
  const tandem::v1::GenerateRequest* second = nullptr;
  for (const auto& request : seen) {
    EXPECT_TRUE(request.prompt().empty());
    if (request.prompt_token_ids_size() == 600) first = &request;
    if (request.prompt_token_ids_size() == 520) second = &request;
  }
  ASSERT_TRUE(first != nullptr && second != nullptr);
  int common = 0;
  while (common < 520 && first->prompt_token_ids(common) == second->prompt_token_ids(common)) {
    ++common;
  }
  EXPECT_GE(common, kTraceBlockTokens);  // block 1 shared, then blocks 2 and 3 differ
  EXPECT_LT(common, kTraceBlockTokens + 8);
}

TEST_F(LoadgenTest, BadDatasetLineFailsBeforeAnythingIsSent) {
  Start();
  const std::string path = ::testing::TempDir() + "/loadgen_bad.jsonl";
  std::ofstream(path) << "{\"prompt\": \"ok\", \"max_tokens\": 3}\n{\"prompt\": \"no max\"}\n";
  nlohmann::json r;
  absl::Status s = Bench({"--dataset", path}, &r);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      s.message(),
      HasSubstr("loadgen_bad.jsonl:2: give exactly one of \"max_tokens\" and \"output_length\""));
  EXPECT_EQ(fake_->calls(), 0);
}

TEST_F(LoadgenTest, StalledServerEndsEveryRequestAtItsDeadline) {
  Start({.release_at_active = 1 << 30});  // holds every stream
  nlohmann::json r;
  absl::Status s = Bench(
      {"--num-requests", "4", "--input-len", "4", "--output-len", "4", "--timeout-seconds", "0.5"},
      &r);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(), HasSubstr("all 4 requests failed"));
  EXPECT_EQ(r["completed"], 0);
  EXPECT_EQ(r["failures_by_code"], nlohmann::json({{"DEADLINE_EXCEEDED", 4}}));
}

TEST_F(LoadgenTest, PromptsLongerThanTheContextAreRejectedUpFront) {
  Start({.context_length = 64});
  nlohmann::json r;
  absl::Status s = Bench({"--input-len", "60", "--output-len", "10"}, &r);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("--input-len and --output-len"));
  EXPECT_EQ(fake_->calls(), 0);
}

TEST_F(LoadgenTest, UnreachableServerIsAnError) {
  Start();
  server_->Shutdown(std::chrono::system_clock::now());
  server_.reset();  // nothing listens on addr_ now
  nlohmann::json r;
  absl::Status s = Bench({"--num-requests", "1", "--timeout-seconds", "5"}, &r);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(), HasSubstr("cannot connect to " + addr_));
}

TEST_F(LoadgenTest, MaxConcurrencyCapsStreamsInFlight) {
  // The server holds streams until 4 are active at once (or all 40 arrived), so a correct cap
  // reaches exactly 4 and a broken one lets the 40 simultaneous arrivals pile up.
  Start({.release_at_active = 4, .release_at_calls = 40});
  LoadClient client(addr_, 2);
  auto requests = MakeRandomDataset(
      {.num_requests = 40, .input_len = 4, .output_len = 3, .vocab_size = 10, .seed = 2});
  LoadResult result =
      client.Run(requests, std::vector<double>(40, 0.0), {.max_concurrency = 4, .timeout_s = 30});
  ASSERT_EQ(result.records.size(), 40u);
  for (const RequestRecord& rec : result.records) EXPECT_TRUE(rec.ok()) << rec.error;
  EXPECT_EQ(fake_->peak_active(), 4);
}

TEST_F(LoadgenTest, SustainsHundredsOfConcurrentStreams) {
  // Nothing is streamed until all 300 streams are open at the same time.
  Start({.release_at_active = 300});
  LoadClient client(addr_, 4);
  auto requests = MakeRandomDataset(
      {.num_requests = 300, .input_len = 8, .output_len = 16, .vocab_size = 50, .seed = 3});
  LoadResult result = client.Run(requests, std::vector<double>(300, 0.0), {.timeout_s = 60});
  int64_t tokens = 0;
  for (const RequestRecord& rec : result.records) {
    ASSERT_TRUE(rec.ok()) << rec.error;
    EXPECT_EQ(rec.streamed_tokens, 16);
    tokens += rec.completion_tokens;
  }
  EXPECT_EQ(tokens, 300 * 16);
  EXPECT_EQ(fake_->peak_active(), 300);
}

TEST_F(LoadgenTest, MultiTokenChunksShareTheirGapEvenly) {
  Start({.chunk_tokens = 3});
  LoadClient client(addr_, 1);
  std::vector<BenchRequest> requests(5, BenchRequest{.prompt = "hi", .max_tokens = 7});
  LoadResult result = client.Run(requests, std::vector<double>(5, 0.0), {.timeout_s = 30});
  for (const RequestRecord& rec : result.records) {
    ASSERT_TRUE(rec.ok()) << rec.error;
    EXPECT_EQ(rec.completion_tokens, 7);
    EXPECT_EQ(rec.streamed_tokens, 7);
    // Chunks of 3, 3, 1: the first chunk's tokens add no gap, then 3 equal shares, then 1.
    ASSERT_EQ(rec.itl_s.size(), 4u);
    EXPECT_EQ(rec.itl_s[0], rec.itl_s[1]);
    EXPECT_EQ(rec.itl_s[1], rec.itl_s[2]);
    const double sum = std::accumulate(rec.itl_s.begin(), rec.itl_s.end(), 0.0);
    EXPECT_NEAR(sum, rec.last_token_s - rec.first_token_s, 1e-9);
  }
}

TEST_F(LoadgenTest, SendsInScheduleOrderNeverEarlyAndReportsProgress) {
  Start();
  LoadClient client(addr_, 2);
  std::vector<double> offsets = {0, 0.01, 0.01, 0.03, 0.05, 0.08};
  std::vector<BenchRequest> requests(offsets.size(), BenchRequest{.prompt = "x", .max_tokens = 2});
  std::atomic<int> finals{0};
  Progress last;
  LoadOptions options{.timeout_s = 30, .on_progress = [&](const Progress& p, bool final) {
                        if (final) ++finals;
                        last = p;
                      }};
  LoadResult result = client.Run(requests, offsets, options);
  ASSERT_EQ(result.records.size(), offsets.size());
  for (size_t i = 0; i < offsets.size(); ++i) {
    const RequestRecord& rec = result.records[i];
    ASSERT_TRUE(rec.ok()) << rec.error;
    EXPECT_EQ(rec.scheduled_s, offsets[i]);
    EXPECT_GE(rec.send_s, rec.scheduled_s);
    if (i > 0) {
      EXPECT_GE(rec.send_s, result.records[i - 1].send_s);
    }
    EXPECT_GE(rec.first_token_s, rec.send_s);
    EXPECT_GE(rec.end_s, rec.last_token_s);
    EXPECT_GE(result.duration_s, rec.end_s);
  }
  EXPECT_EQ(finals.load(), 1);
  EXPECT_EQ(last.done, 6);
  EXPECT_EQ(last.sent, 6);
  EXPECT_EQ(last.failed, 0);
}

}  // namespace
}  // namespace tandem::bench
