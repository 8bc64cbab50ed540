// `tandem bench --api http` against a fake OpenAI-compatible server on loopback (Tandem's HTTP
// server with a scripted handler): token counts from the SSE events and the usage chunk,
// refusals counted by code, and many streams at once.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "absl/strings/str_cat.h"
#include "bench/serving/bench_command.h"
#include "common/util/file_util.h"
#include "nlohmann/json.hpp"
#include "router/http/http_server.h"
#include "tests/unit/bench/args.h"

namespace tandem::bench {
namespace {

using nlohmann::json;
using router::HttpRequest;
using router::HttpResponder;

class LoadgenHttpTest : public ::testing::Test {
 protected:
  // Streams `max_tokens` one-token events, a finish, the usage and [DONE]; every
  // `fail_every`-th completion gets 429 instead.
  void Start(int fail_every = 0) {
    server_ = router::HttpServer::Start(
                  {.listen = "127.0.0.1:0", .threads = 2},
                  [this, fail_every](HttpRequest r, std::shared_ptr<HttpResponder> out) {
                    if (r.target == "/v1/models") {
                      out->Reply(200, "application/json",
                                 R"({"object":"list","data":[{"id":"fake","max_model_len":512}]})");
                      return;
                    }
                    const json body = json::parse(r.body);
                    {
                      absl::MutexLock lock(&mu_);
                      bodies_.push_back(body);
                    }
                    if (fail_every > 0 && ++calls_ % fail_every == 0) {
                      out->Reply(429, "application/json", R"({"error":{"message":"busy"}})");
                      return;
                    }
                    const int n = body["max_tokens"];
                    const int prompt = static_cast<int>(body["prompt"].size());
                    std::thread([out, n, prompt] {
                      out->StartStream(200, "text/event-stream");
                      for (int i = 0; i < n; ++i) {
                        out->Write(R"(data: {"choices":[{"index":0,"text":"t","finish_reason":null}]})"
                                   "\n\n");
                      }
                      out->Write(R"(data: {"choices":[{"index":0,"text":"","finish_reason":"length"}]})"
                                 "\n\n");
                      out->Write(absl::StrCat(R"(data: {"choices":[],"usage":{"prompt_tokens":)",
                                              prompt, R"(,"completion_tokens":)", n, "}}\n\n"));
                      out->Write("data: [DONE]\n\n");
                      out->EndStream();
                    }).detach();
                  })
                  .value();
    addr_ = absl::StrCat("127.0.0.1:", server_->port());
  }

  absl::Status Bench(std::vector<std::string> words, json* report) {
    const std::string path = ::testing::TempDir() + "/loadgen_http_" +
                             ::testing::UnitTest::GetInstance()->current_test_info()->name() +
                             ".json";
    std::remove(path.c_str());
    words.insert(words.end(),
                 {"--addr", addr_, "--api", "http", "--progress=false", "--json-out", path});
    auto args = testing::BenchArgs(words);
    if (!args.ok()) return args.status();
    absl::Status status = RunBenchCommand(*args);
    auto text = ReadFileToString(path);
    if (text.ok()) *report = json::parse(*text);
    return status;
  }

  std::unique_ptr<router::HttpServer> server_;
  std::string addr_;
  std::atomic<int> calls_{0};
  absl::Mutex mu_;
  std::vector<json> bodies_ ABSL_GUARDED_BY(mu_);
};

TEST_F(LoadgenHttpTest, CountsTokensFromTheStreamAndTheUsage) {
  Start();
  json r;
  ASSERT_TRUE(Bench({"--num-requests", "40", "--input-len", "16", "--output-len", "8",
                     "--vocab-size", "50"},
                    &r)
                  .ok());
  EXPECT_EQ(r["completed"], 40);
  EXPECT_EQ(r["failed"], 0);
  EXPECT_EQ(r["total_input_tokens"], 40 * 16);
  EXPECT_EQ(r["total_output_tokens"], 40 * 8);
  EXPECT_EQ(r["itl_ms"]["count"], 40 * 7);
  EXPECT_EQ(r["config"]["model"], "fake");
  absl::MutexLock lock(&mu_);
  ASSERT_EQ(bodies_.size(), 40u);
  for (const json& b : bodies_) {
    ASSERT_EQ(b["prompt"].size(), 16u);
    for (const json& id : b["prompt"]) ASSERT_LT(id.get<int>(), 50);
    EXPECT_EQ(b["max_tokens"], 8);
    EXPECT_EQ(b["stream"], true);
    EXPECT_EQ(b["ignore_eos"], true);
    EXPECT_EQ(b["temperature"], 0);
    EXPECT_EQ(b["stream_options"]["include_usage"], true);
  }
}

TEST_F(LoadgenHttpTest, RefusalsAreCountedWithTheirCode) {
  Start(/*fail_every=*/4);
  json r;
  ASSERT_TRUE(Bench({"--num-requests", "20", "--input-len", "4", "--output-len", "3",
                     "--vocab-size", "50"},
                    &r)
                  .ok());
  EXPECT_EQ(r["completed"], 15);
  EXPECT_EQ(r["failures_by_code"], json({{"RESOURCE_EXHAUSTED", 5}}));
  EXPECT_NE(r["first_error"].get<std::string>().find("HTTP 429"), std::string::npos);
}

TEST_F(LoadgenHttpTest, RandomPromptsNeedTheVocabularySize) {
  Start();
  json r;
  absl::Status s = Bench({"--num-requests", "2"}, &r);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("--vocab-size"), std::string::npos) << s;
}

TEST_F(LoadgenHttpTest, SustainsHundredsOfConcurrentStreams) {
  Start();
  json r;
  ASSERT_TRUE(Bench({"--num-requests", "300", "--input-len", "4", "--output-len", "20",
                     "--vocab-size", "50"},
                    &r)
                  .ok());
  EXPECT_EQ(r["completed"], 300);
  EXPECT_EQ(r["total_output_tokens"], 300 * 20);
}

}  // namespace
}  // namespace tandem::bench
