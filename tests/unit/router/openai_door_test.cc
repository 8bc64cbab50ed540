// The OpenAI door over a real router and real workers (router_cluster.h), driven over HTTP by a
// raw client. The tiny model has no tokenizer, so these tests check the protocol, token counts
// and lifetimes; text against the gRPC API is checked end to end (tests/integration, `http`).
#include "router/http/openai_door.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "common/security/api_keys.h"
#include "router/http/http_server.h"
#include "tests/unit/router/raw_http_client.h"
#include "tests/unit/router/router_cluster.h"
#include "tests/unit/testing/eventually.h"

namespace tandem::router {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;
using testing::RawHttpClient;

constexpr milliseconds kWait{60000};

class OpenAiDoorTest : public testing::RouterClusterTest {
 protected:
  void StartDoor(RouterOptions options = {}, bool health_needs_key = false) {
    StartCluster(64 << 20, std::move(options));
    door_ = std::make_unique<OpenAiDoor>(*router_, OpenAiLimits{.model_name = "tiny",
                                                                .context_length = 512,
                                                                .max_n = 4,
                                                                .health_needs_key =
                                                                    health_needs_key});
    http_ = HttpServer::Start({.listen = "127.0.0.1:0", .refusal_body = &OpenAiDoor::RefusalBody},
                              [this](HttpRequest r, std::shared_ptr<HttpResponder> responder) {
                                door_->Handle(std::move(r), std::move(responder));
                              })
                .value();
  }
  void TearDown() override {
    http_.reset();
    RouterClusterTest::TearDown();
  }

  static std::string Post(const std::string& path, const std::string& body) {
    return absl::StrCat("POST ", path, " HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n",
                        "Content-Length: ", body.size(), "\r\n\r\n", body);
  }

  // One whole (Content-Length) response: {status, body}.
  std::pair<int, std::string> Call(const std::string& request) {
    RawHttpClient c(http_->port());
    c.Send(request);
    const std::string& r = c.ReadUntil(
        [](const std::string& got) {
          const size_t head = got.find("\r\n\r\n");
          if (head == std::string::npos) return false;
          const size_t cl = got.find("Content-Length: ");
          if (cl == std::string::npos || cl > head) return false;
          return got.size() >= head + 4 + std::stoul(got.substr(cl + 16));
        },
        kWait);
    const size_t head = r.find("\r\n\r\n");
    if (head == std::string::npos) return {0, r};
    return {std::stoi(r.substr(9, 3)), r.substr(head + 4)};
  }

  // Prefix-cache block hits of every prefill engine, since it started.
  int64_t PrefillHits() {
    int64_t hits = 0;
    for (auto& loop : prefill_loops_) {
      auto done = std::make_shared<absl::Notification>();
      auto n = std::make_shared<int64_t>(0);
      loop->Post([done, n](engine::Engine& e) {
        *n = e.KvStats().hits;
        done->Notify();
      });
      EXPECT_TRUE(done->WaitForNotificationWithTimeout(absl::Seconds(30)));
      hits += *n;
    }
    return hits;
  }

  std::unique_ptr<OpenAiDoor> door_;
  std::unique_ptr<HttpServer> http_;
};

TEST_F(OpenAiDoorTest, CompletionOfTokenIds) {
  StartDoor();
  const auto [status, body] = Call(Post(
      "/v1/completions",
      R"({"model": "tiny", "prompt": [5, 6, 7, 8], "max_tokens": 9, "temperature": 0,
          "ignore_eos": true})"));
  ASSERT_EQ(status, 200) << body;
  const json r = json::parse(body);
  EXPECT_EQ(r["object"], "text_completion");
  EXPECT_EQ(r["model"], "tiny");
  EXPECT_EQ(r["id"].get<std::string>().rfind("cmpl-", 0), 0u);
  ASSERT_EQ(r["choices"].size(), 1u);
  EXPECT_EQ(r["choices"][0]["index"], 0);
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(r["usage"]["prompt_tokens"], 4);
  EXPECT_EQ(r["usage"]["completion_tokens"], 9);
  EXPECT_EQ(r["usage"]["total_tokens"], 13);
  EXPECT_TRUE(r["usage"]["prompt_tokens_details"]["cached_tokens"].is_number());
}

TEST_F(OpenAiDoorTest, NChoicesOfSeveralPrompts) {
  StartDoor();
  const auto [status, body] = Call(Post(
      "/v1/completions",
      R"({"prompt": [[5, 6, 7], [9, 10]], "n": 3, "max_tokens": 4, "seed": 11,
          "ignore_eos": true})"));
  ASSERT_EQ(status, 200) << body;
  const json r = json::parse(body);
  ASSERT_EQ(r["choices"].size(), 6u);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(r["choices"][i]["index"], i);
  EXPECT_EQ(r["usage"]["prompt_tokens"], 5);  // each prompt once
  EXPECT_EQ(r["usage"]["completion_tokens"], 24);
  EXPECT_TRUE(AllBlocksFree());
}

TEST_F(OpenAiDoorTest, NChoicesShareOnePrefillOfThePrompt) {
  StartDoor();
  json prompt = json::array();
  for (int i = 0; i < 40; ++i) prompt.push_back((i * 7 + 3) % 128);  // 2 whole blocks of 16
  const int64_t before = PrefillHits();
  const auto [status, body] = Call(Post(
      "/v1/completions",
      json{{"prompt", prompt}, {"n", 4}, {"max_tokens", 3}, {"temperature", 0.7}}.dump()));
  ASSERT_EQ(status, 200) << body;
  EXPECT_EQ(json::parse(body)["choices"].size(), 4u);
  // The first choice prefilled the prompt; the other three found its 2 blocks cached.
  EXPECT_GE(PrefillHits() - before, 3 * 2);
}

TEST_F(OpenAiDoorTest, StreamEndsWithFinishUsageAndDone) {
  StartDoor();
  RawHttpClient c(http_->port());
  c.Send(Post("/v1/completions",
              R"({"prompt": [5, 6, 7], "max_tokens": 5, "stream": true, "n": 2,
                  "stream_options": {"include_usage": true}, "ignore_eos": true})"));
  const std::string& r = c.ReadUntilContains("0\r\n\r\n", kWait);
  bool complete = false;
  const std::string body = testing::DecodeChunked(r, &complete);
  ASSERT_TRUE(complete) << r;
  EXPECT_NE(r.find("Content-Type: text/event-stream"), std::string::npos);
  std::vector<std::string> events;
  for (absl::string_view e : absl::StrSplit(body, "\n\n", absl::SkipEmpty())) {
    ASSERT_TRUE(absl::StartsWith(e, "data: ")) << e;
    events.emplace_back(e.substr(6));
  }
  ASSERT_GE(events.size(), 4u);
  EXPECT_EQ(events.back(), "[DONE]");
  const json usage = json::parse(events[events.size() - 2]);
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 10);
  int finished = 0;
  for (size_t i = 0; i + 2 < events.size(); ++i) {
    const json e = json::parse(events[i]);
    EXPECT_TRUE(e["usage"].is_null());
    if (e["choices"][0]["finish_reason"] == "length") ++finished;
  }
  EXPECT_EQ(finished, 2);
}

TEST_F(OpenAiDoorTest, AClientThatLeavesAbortsItsRequestAndFreesItsBlocks) {
  StartDoor();
  RawHttpClient c(http_->port());
  c.Send(Post("/v1/completions",
              R"({"prompt": [5, 6, 7, 8, 9], "max_tokens": 400, "stream": true,
                  "ignore_eos": true})"));
  // The first streamed token shows the request running. (Polling the router's running count
  // instead missed it on a loaded CI machine: 400 tokens of the tiny model can finish between two
  // polls.)
  const std::string& first = c.ReadUntilContains("data: ", kWait);
  ASSERT_NE(first.find("data: "), std::string::npos) << first;
  c.Close();
  EXPECT_TRUE(testing::Eventually([&] { return AllBlocksFree(); }, std::chrono::seconds(30)));
}

TEST_F(OpenAiDoorTest, ErrorsHaveTheirStatusAndBody) {
  StartDoor();
  struct Case {
    std::string request;
    int status;
    std::string param;
  };
  const Case cases[] = {
      {Post("/v1/completions", "{oops"), 400, ""},
      {Post("/v1/completions", R"({"prompt": [1, 500]})"), 400, "prompt"},  // outside the vocab
      {Post("/v1/completions", R"({"prompt": [1], "max_tokens": 600})"), 400, "max_tokens"},
      {Post("/v1/completions", R"({"prompt": "text"})"), 400, "prompt"},  // no tokenizer
      {Post("/v1/completions", R"({"prompt": [1], "model": "gpt-4"})"), 404, "model"},
      {Post("/v1/completions", R"({"prompt": [1], "frobnicate": 1})"), 400, "frobnicate"},
      {Post("/v1/nothing", "{}"), 404, ""},
      {"GET /v1/completions HTTP/1.1\r\n\r\n", 405, ""},
  };
  for (const Case& c : cases) {
    const auto [status, body] = Call(c.request);
    EXPECT_EQ(status, c.status) << c.request << " -> " << body;
    const json e = json::parse(body);
    EXPECT_FALSE(e["error"]["message"].get<std::string>().empty()) << body;
    EXPECT_EQ(e["error"]["param"].is_null() ? "" : e["error"]["param"].get<std::string>(),
              c.param)
        << body;
  }
  EXPECT_TRUE(AllBlocksFree());
}

TEST_F(OpenAiDoorTest, ModelsAndHealth) {
  StartDoor();
  auto [status, body] = Call("GET /v1/models HTTP/1.1\r\n\r\n");
  ASSERT_EQ(status, 200);
  const json models = json::parse(body);
  EXPECT_EQ(models["data"][0]["id"], "tiny");
  EXPECT_EQ(models["data"][0]["max_model_len"], 512);
  std::tie(status, body) = Call("GET /health HTTP/1.1\r\n\r\n");
  EXPECT_EQ(status, 200) << body;
  for (const auto& a : decode_addresses_) router_->decode_pool().Remove(a);
  std::tie(status, body) = Call("GET /health HTTP/1.1\r\n\r\n");
  EXPECT_EQ(status, 503) << body;
  EXPECT_NE(body.find("no decode worker"), std::string::npos);
  // Without workers a completion is 503 too.
  std::tie(status, body) = Call(Post("/v1/completions", R"({"prompt": [1, 2]})"));
  EXPECT_EQ(status, 503) << body;
}

}  // namespace
}  // namespace tandem::router

namespace tandem::router {
namespace {

// API keys on the HTTP door: every route but /health asks for one (401 with WWW-Authenticate:
// Bearer), /health too when health_needs_key; the n choices of one request share one
// concurrency slot of the key.
class OpenAiDoorKeysTest : public OpenAiDoorTest {
 protected:
  void SetUp() override {
    OpenAiDoorTest::SetUp();
    path_ = (std::filesystem::temp_directory_path() /
             absl::StrCat("tandem_door_keys_", getpid()))
                .string();
    std::ofstream(path_) << security::KeyDigestHex("k-alice") << " alice max_concurrent=1\n";
    keys_ = security::ApiKeys::Load(path_, {}, nullptr).value();
  }
  void TearDown() override {
    OpenAiDoorTest::TearDown();
    std::filesystem::remove(path_);
  }
  RouterOptions WithKeys() {
    RouterOptions o;
    o.api_keys = keys_.get();
    return o;
  }
  std::string path_;
  std::unique_ptr<security::ApiKeys> keys_;
};

TEST_F(OpenAiDoorKeysTest, EveryRouteButHealthNeedsAKey) {
  StartDoor(WithKeys());
  RawHttpClient c(http_->port());
  c.Send("GET /v1/models HTTP/1.1\r\n\r\n");
  const std::string refused = c.ReadUntil(
      [](const std::string& got) { return got.find("missing API key") != std::string::npos; },
      kWait);
  EXPECT_EQ(refused.substr(9, 3), "401") << refused;
  EXPECT_NE(refused.find("WWW-Authenticate: Bearer"), std::string::npos) << refused;
  EXPECT_NE(Call("GET /health HTTP/1.1\r\n\r\n").first, 401);
  EXPECT_EQ(Call("GET /v1/models HTTP/1.1\r\nAuthorization: Bearer k-alice\r\n\r\n").first, 200);
  EXPECT_EQ(Call("GET /v1/models HTTP/1.1\r\nAuthorization: Bearer k-bob\r\n\r\n").first, 401);
  // n = 3 under max_concurrent=1: one request, one slot.
  const std::string body =
      R"({"model": "tiny", "prompt": [5, 6, 7, 8], "max_tokens": 3, "n": 3, "ignore_eos": true})";
  const auto [status, text] =
      Call(absl::StrCat("POST /v1/completions HTTP/1.1\r\nAuthorization: Bearer k-alice\r\n",
                        "Content-Type: application/json\r\nContent-Length: ", body.size(),
                        "\r\n\r\n", body));
  EXPECT_EQ(status, 200) << text;
  EXPECT_EQ(json::parse(text)["choices"].size(), 3u);
}

TEST_F(OpenAiDoorKeysTest, HealthNeedsAKeyWhenConfigured) {
  StartDoor(WithKeys(), /*health_needs_key=*/true);
  EXPECT_EQ(Call("GET /health HTTP/1.1\r\n\r\n").first, 401);
  EXPECT_NE(Call("GET /health HTTP/1.1\r\nAuthorization: Bearer k-alice\r\n\r\n").first, 401);
}

}  // namespace
}  // namespace tandem::router
