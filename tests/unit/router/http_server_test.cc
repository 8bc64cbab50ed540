#include "router/http/http_server.h"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "tests/unit/router/raw_http_client.h"

namespace tandem::router {
namespace {

using std::chrono::milliseconds;
using testing::DecodeChunked;
using testing::RawHttpClient;

constexpr milliseconds kWait{10000};

// A server whose handler a test scripts by path: /echo replies with the method and body;
// /stream streams "a", "b", "c"; /hold starts a stream and hands the responder to the test.
class HttpServerTest : public ::testing::Test {
 protected:
  void Start(HttpServerOptions options = {}) {
    options.listen = "127.0.0.1:0";
    server_ = HttpServer::Start(options, [this](HttpRequest request,
                                                std::shared_ptr<HttpResponder> responder) {
                ++handled_;
                if (request.target == "/echo") {
                  responder->Reply(200, "text/plain",
                                   absl::StrCat(request.method, " ", request.body, " ",
                                                request.Header("x-test")));
                } else if (request.target == "/stream") {
                  // From another thread, as the router's gRPC callbacks do.
                  std::thread([responder] {
                    responder->StartStream(200, "text/event-stream");
                    for (const char* piece : {"a", "b", "c"}) responder->Write(piece);
                    responder->EndStream();
                  }).detach();
                } else if (request.target == "/hold") {
                  responder->OnAbort([this] { aborted_.Notify(); });
                  responder->StartStream(200, "text/event-stream");
                  absl::MutexLock lock(&mu_);
                  held_ = responder;
                } else {
                  responder->Reply(404, "text/plain", "no");
                }
              }).value();
  }

  std::shared_ptr<HttpResponder> WaitHeld() {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(
                             +[](std::shared_ptr<HttpResponder>* h) { return *h != nullptr; },
                             &held_),
                         absl::Seconds(10));
    return held_;
  }

  std::unique_ptr<HttpServer> server_;
  std::atomic<int> handled_{0};
  absl::Notification aborted_;
  absl::Mutex mu_;
  std::shared_ptr<HttpResponder> held_ ABSL_GUARDED_BY(mu_);
};

TEST_F(HttpServerTest, KeepAliveServesRequestsInTurnOnOneConnection) {
  Start();
  RawHttpClient c(server_->port());
  ASSERT_TRUE(c.connected());
  for (int i = 0; i < 3; ++i) {
    c.Clear();
    const std::string body = absl::StrCat("body", i);
    ASSERT_TRUE(c.Send(absl::StrCat("POST /echo HTTP/1.1\r\nHost: x\r\nX-Test: t", i,
                                    "\r\nContent-Length: ", body.size(), "\r\n\r\n", body)));
    const std::string& r = c.ReadUntilContains(absl::StrCat("t", i), kWait);
    EXPECT_NE(r.find("HTTP/1.1 200 OK"), std::string::npos) << r;
    EXPECT_NE(r.find(absl::StrCat("POST body", i, " t", i)), std::string::npos) << r;
  }
  EXPECT_FALSE(c.peer_closed());
  EXPECT_EQ(server_->connections(), 1);
}

TEST_F(HttpServerTest, PipelinedRequestsAreAnsweredInOrder) {
  Start();
  RawHttpClient c(server_->port());
  ASSERT_TRUE(c.Send(
      "POST /echo HTTP/1.1\r\nContent-Length: 3\r\n\r\none"
      "POST /echo HTTP/1.1\r\nContent-Length: 3\r\n\r\ntwo"));
  const std::string& r = c.ReadUntilContains("POST two", kWait);
  ASSERT_NE(r.find("POST one"), std::string::npos) << r;
  EXPECT_LT(r.find("POST one"), r.find("POST two"));
}

TEST_F(HttpServerTest, StreamsAreChunkedAndEndWithTheLastChunk) {
  Start();
  RawHttpClient c(server_->port());
  ASSERT_TRUE(c.Send("GET /stream HTTP/1.1\r\nHost: x\r\n\r\n"));
  const std::string& r = c.ReadUntilContains("0\r\n\r\n", kWait);
  EXPECT_NE(r.find("Transfer-Encoding: chunked"), std::string::npos) << r;
  EXPECT_NE(r.find("Content-Type: text/event-stream"), std::string::npos) << r;
  bool complete = false;
  EXPECT_EQ(DecodeChunked(r, &complete), "abc");
  EXPECT_TRUE(complete);
  // The connection stays usable.
  c.Clear();
  ASSERT_TRUE(c.Send("POST /echo HTTP/1.1\r\nContent-Length: 2\r\n\r\nok"));
  EXPECT_NE(c.ReadUntilContains("POST ok", kWait).find("POST ok"), std::string::npos);
}

TEST_F(HttpServerTest, AnHttp10StreamEndsByClosing) {
  Start();
  RawHttpClient c(server_->port());
  ASSERT_TRUE(c.Send("GET /stream HTTP/1.0\r\n\r\n"));
  const std::string& r = c.ReadToClose(kWait);
  EXPECT_TRUE(c.peer_closed());
  EXPECT_EQ(r.find("chunked"), std::string::npos) << r;
  EXPECT_EQ(r.substr(r.size() - 3), "abc") << r;
}

TEST_F(HttpServerTest, ABodyOverTheLimitIsRefusedBeforeItIsRead) {
  Start({.max_body_bytes = 1000,
         .refusal_body = [](int status, const std::string& message) {
           return std::make_pair(std::string("application/json"),
                                 absl::StrCat("{\"status\":", status, ",\"m\":\"", message, "\"}"));
         }});
  RawHttpClient c(server_->port());
  ASSERT_TRUE(c.Send("POST /echo HTTP/1.1\r\nContent-Length: 10000000\r\n\r\n"));
  const std::string& r = c.ReadToClose(kWait);
  EXPECT_NE(r.find("HTTP/1.1 413"), std::string::npos) << r;
  EXPECT_NE(r.find("{\"status\":413,\"m\":\"the request body is larger than 1000 bytes\"}"),
            std::string::npos)
      << r;
  EXPECT_TRUE(c.peer_closed());
  EXPECT_EQ(handled_.load(), 0);
}

TEST_F(HttpServerTest, AHeaderOverTheLimitIsRefused) {
  Start({.max_header_bytes = 1024});
  RawHttpClient c(server_->port());
  ASSERT_TRUE(c.Send(absl::StrCat("GET /echo HTTP/1.1\r\nX-Big: ", std::string(4000, 'x'),
                                  "\r\n\r\n")));
  EXPECT_NE(c.ReadToClose(kWait).find("HTTP/1.1 431"), std::string::npos) << c.received();
  EXPECT_EQ(handled_.load(), 0);
}

TEST_F(HttpServerTest, MalformedRequestsGet400AndTheServerKeepsServing) {
  Start();
  RawHttpClient bad(server_->port());
  ASSERT_TRUE(bad.Send("NOT HTTP AT ALL\r\n\r\n"));
  EXPECT_NE(bad.ReadToClose(kWait).find("HTTP/1.1 400"), std::string::npos) << bad.received();
  RawHttpClient good(server_->port());
  ASSERT_TRUE(good.Send("POST /echo HTTP/1.1\r\nContent-Length: 1\r\n\r\nx"));
  EXPECT_NE(good.ReadUntilContains("POST x", kWait).find("POST x"), std::string::npos);
}

TEST_F(HttpServerTest, AStalledRequestTimesOutWith408AndAnIdleConnectionCloses) {
  Start({.read_timeout = milliseconds(300)});
  RawHttpClient stalled(server_->port());
  ASSERT_TRUE(stalled.Send("POST /echo HTTP/1.1\r\nContent-Length: 100\r\n\r\nonly some"));
  EXPECT_NE(stalled.ReadToClose(kWait).find("HTTP/1.1 408"), std::string::npos)
      << stalled.received();
  RawHttpClient idle(server_->port());
  idle.ReadToClose(kWait);
  EXPECT_TRUE(idle.peer_closed());
  EXPECT_EQ(idle.received(), "");
  EXPECT_EQ(handled_.load(), 0);
}

TEST_F(HttpServerTest, AClientThatLeavesMidStreamAbortsTheResponse) {
  Start();
  RawHttpClient c(server_->port());
  ASSERT_TRUE(c.Send("GET /hold HTTP/1.1\r\n\r\n"));
  std::shared_ptr<HttpResponder> held = WaitHeld();
  ASSERT_NE(held, nullptr);
  held->Write("data: 1\n\n");
  EXPECT_NE(c.ReadUntilContains("data: 1", kWait).find("data: 1"), std::string::npos);
  c.Close();
  EXPECT_TRUE(aborted_.WaitForNotificationWithTimeout(absl::Seconds(10)));
  // Writes after the abort are dropped.
  held->Write("data: 2\n\n");
  held->EndStream();
}

TEST_F(HttpServerTest, AClientThatNeverReadsIsCutOff) {
  std::atomic<int> cut_off{0};
  Start({.write_timeout = milliseconds(500),
         .max_pending_write_bytes = 1 << 20,
         .on_client_cut_off = [&cut_off] { ++cut_off; }});
  RawHttpClient c(server_->port());
  c.SetReceiveBuffer(4096);
  ASSERT_TRUE(c.Send("GET /hold HTTP/1.1\r\n\r\n"));
  std::shared_ptr<HttpResponder> held = WaitHeld();
  ASSERT_NE(held, nullptr);
  const std::string piece(64 << 10, 'x');
  for (int i = 0; i < 64 && !aborted_.HasBeenNotified(); ++i) held->Write(piece);  // 4 MiB
  EXPECT_TRUE(aborted_.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(cut_off, 1);  // counted (tandem_stalled_streams_total)
  // Others are still served.
  RawHttpClient other(server_->port());
  ASSERT_TRUE(other.Send("POST /echo HTTP/1.1\r\nContent-Length: 1\r\n\r\ny"));
  EXPECT_NE(other.ReadUntilContains("POST y", kWait).find("POST y"), std::string::npos);
}

TEST_F(HttpServerTest, StoppingTheServerAbortsResponsesInProgress) {
  Start();
  RawHttpClient c(server_->port());
  ASSERT_TRUE(c.Send("GET /hold HTTP/1.1\r\n\r\n"));
  std::shared_ptr<HttpResponder> held = WaitHeld();
  ASSERT_NE(held, nullptr);
  server_.reset();
  EXPECT_TRUE(aborted_.HasBeenNotified());
  held->Write("late");  // the server is gone: dropped, not a crash
  c.ReadToClose(kWait);
  EXPECT_TRUE(c.peer_closed());
}

TEST_F(HttpServerTest, CorsAllowsOnlyTheConfiguredOriginsAndAnswersTheirPreflights) {
  Start({.cors_origins = {"https://app.example"}});
  RawHttpClient c(server_->port());
  // A preflight from the allowed origin: 204 with what the page may send, never the handler.
  ASSERT_TRUE(c.Send(
      "OPTIONS /echo HTTP/1.1\r\nOrigin: https://app.example\r\n"
      "Access-Control-Request-Method: POST\r\n"
      "Access-Control-Request-Headers: authorization, content-type\r\n\r\n"));
  std::string r = c.ReadUntilContains("\r\n\r\n", kWait);
  EXPECT_NE(r.find("HTTP/1.1 204"), std::string::npos) << r;
  EXPECT_NE(r.find("Access-Control-Allow-Origin: https://app.example"), std::string::npos) << r;
  EXPECT_NE(r.find("Access-Control-Allow-Methods: GET, POST, OPTIONS"), std::string::npos) << r;
  EXPECT_NE(r.find("Access-Control-Allow-Headers: authorization, content-type"),
            std::string::npos)
      << r;
  EXPECT_EQ(handled_, 0);
  // Its request, on the same connection, is answered with the origin allowed.
  c.Clear();
  ASSERT_TRUE(c.Send("POST /echo HTTP/1.1\r\nOrigin: https://app.example\r\n"
                     "Content-Length: 2\r\n\r\nhi"));
  r = c.ReadUntilContains("POST hi", kWait);
  EXPECT_NE(r.find("Access-Control-Allow-Origin: https://app.example"), std::string::npos) << r;
  EXPECT_NE(r.find("Vary: Origin"), std::string::npos) << r;
  // Another origin: its preflight is refused, and its requests carry no CORS header (the
  // browser keeps the answer from the page).
  c.Clear();
  ASSERT_TRUE(c.Send("OPTIONS /echo HTTP/1.1\r\nOrigin: https://evil.example\r\n"
                     "Access-Control-Request-Method: POST\r\n\r\n"));
  r = c.ReadUntilContains("not allowed", kWait);
  EXPECT_NE(r.find("HTTP/1.1 403"), std::string::npos) << r;
  EXPECT_EQ(r.find("Access-Control-Allow-Origin"), std::string::npos) << r;
  c.Clear();
  ASSERT_TRUE(c.Send("POST /echo HTTP/1.1\r\nOrigin: https://evil.example\r\n"
                     "Content-Length: 2\r\n\r\nhi"));
  r = c.ReadUntilContains("POST hi", kWait);
  EXPECT_EQ(r.find("Access-Control-Allow-Origin"), std::string::npos) << r;
  EXPECT_EQ(handled_, 2);
}

TEST_F(HttpServerTest, CorsIsOffByDefaultAndAWildcardAllowsAnyOrigin) {
  Start();
  {
    RawHttpClient c(server_->port());
    ASSERT_TRUE(c.Send("OPTIONS /echo HTTP/1.1\r\nOrigin: https://app.example\r\n"
                       "Access-Control-Request-Method: POST\r\n\r\n"));
    const std::string& r = c.ReadUntilContains("not allowed", kWait);
    EXPECT_NE(r.find("HTTP/1.1 403"), std::string::npos) << r;
    EXPECT_EQ(r.find("Vary"), std::string::npos) << r;
  }
  server_.reset();
  Start({.cors_origins = {"*"}});
  RawHttpClient c(server_->port());
  ASSERT_TRUE(c.Send("GET /echo HTTP/1.1\r\nOrigin: http://localhost:3000\r\n\r\n"));
  const std::string& r = c.ReadUntilContains("GET", kWait);
  EXPECT_NE(r.find("Access-Control-Allow-Origin: *"), std::string::npos) << r;
  // An OPTIONS that is not a preflight goes to the handler like any request.
  c.Clear();
  ASSERT_TRUE(c.Send("OPTIONS /echo HTTP/1.1\r\n\r\n"));
  EXPECT_NE(c.ReadUntilContains("OPTIONS", kWait).find("200 OK"), std::string::npos);
}

TEST(SplitHostPortTest, ParsesAndRefuses) {
  EXPECT_EQ(SplitHostPort("127.0.0.1:8080").value(), std::make_pair(std::string("127.0.0.1"), 8080));
  EXPECT_EQ(SplitHostPort("[::1]:0").value(), std::make_pair(std::string("::1"), 0));
  EXPECT_EQ(SplitHostPort("localhost:1").value().first, "localhost");
  for (const char* bad : {"", "8080", ":80", "host:", "host:x", "host:70000", "host:-1"}) {
    EXPECT_FALSE(SplitHostPort(bad).ok()) << bad;
  }
}

TEST(HttpServerStartTest, ATakenPortIsUnavailable) {
  auto handler = [](HttpRequest, std::shared_ptr<HttpResponder> r) { r->Reply(200, "a", "b"); };
  auto first = HttpServer::Start({.listen = "127.0.0.1:0"}, handler).value();
  auto second = HttpServer::Start({.listen = absl::StrCat("127.0.0.1:", first->port())}, handler);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable) << second.status();
  EXPECT_EQ(HttpServer::Start({.listen = "nohost"}, handler).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem::router
