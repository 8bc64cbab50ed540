#include "bench/serving/http_calls.h"

#include <boost/asio/connect.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <nlohmann/json.hpp>
#include <limits>
#include <optional>
#include <thread>
#include <type_traits>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace tandem::bench {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using nlohmann::json;

absl::StatusCode CodeOfHttpStatus(int status) {
  switch (status) {
    case 400:
    case 404:
    case 413:
      return absl::StatusCode::kInvalidArgument;
    case 429:
      return absl::StatusCode::kResourceExhausted;
    case 503:
      return absl::StatusCode::kUnavailable;
    case 504:
      return absl::StatusCode::kDeadlineExceeded;
    default:
      return absl::StatusCode::kInternal;
  }
}

}  // namespace

struct HttpCalls::Impl {
  net::io_context ioc;
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work;
  std::vector<std::thread> threads;
  tcp::endpoint endpoint;
  std::string host;  // the Host header
  std::string server_name;  // HTTPS: the name the certificate must carry (SNI too)
  std::string authorization;  // empty: none
  std::optional<net::ssl::context> tls;  // HTTPS; none: plain HTTP
};

namespace {

// A connection to the server: plain TCP, or TLS over it (kTls).
template <bool kTls>
using Stream =
    std::conditional_t<kTls, beast::ssl_stream<beast::tcp_stream>, beast::tcp_stream>;

template <bool kTls, typename Executor>
Stream<kTls> NewStream(HttpCalls::Impl& impl, Executor executor) {
  if constexpr (kTls) {
    return Stream<kTls>(executor, *impl.tls);
  } else {
    return Stream<kTls>(executor);
  }
}

// HTTPS: names the server (SNI) and checks that its certificate is for that name.
template <bool kTls>
absl::Status PrepareHandshake(HttpCalls::Impl& impl, Stream<kTls>& stream) {
  if constexpr (kTls) {
    if (SSL_set_tlsext_host_name(stream.native_handle(), impl.server_name.c_str()) != 1) {
      return absl::InternalError("cannot set the TLS server name");
    }
    stream.set_verify_callback(net::ssl::host_name_verification(impl.server_name));
  }
  return absl::OkStatus();
}

// One streaming completion on its own connection; keeps itself alive through its pending
// operations and ends with `on_done`.
template <bool kTls>
class StreamCall : public std::enable_shared_from_this<StreamCall<kTls>> {
 public:
  StreamCall(HttpCalls::Impl& impl, std::string body, std::chrono::steady_clock::time_point deadline,
             const RunClock& clock, RequestRecord& record, std::function<void(bool)> on_done)
      : impl_(impl),
        stream_(NewStream<kTls>(impl, net::make_strand(impl.ioc))),
        body_(std::move(body)),
        deadline_(deadline),
        clock_(clock),
        record_(record),
        on_done_(std::move(on_done)) {}

  void Run() {
    record_.send_s = clock_.Now();
    beast::get_lowest_layer(stream_).expires_at(deadline_);
    beast::get_lowest_layer(stream_).async_connect(
        impl_.endpoint, [self = this->shared_from_this()](beast::error_code ec) {
          self->OnConnect(ec);
        });
  }

 private:
  void OnConnect(beast::error_code ec) {
    if (ec) return Fail(absl::StatusCode::kUnavailable, "connect: " + ec.message());
    beast::error_code ignored;
    beast::get_lowest_layer(stream_).socket().set_option(tcp::no_delay(true), ignored);
    if constexpr (kTls) {
      if (absl::Status s = PrepareHandshake<kTls>(impl_, stream_); !s.ok()) {
        return Fail(absl::StatusCode::kInternal, std::string(s.message()));
      }
      stream_.async_handshake(net::ssl::stream_base::client,
                              [self = this->shared_from_this()](beast::error_code ec) {
                                if (ec) {
                                  return self->Fail(absl::StatusCode::kUnavailable,
                                                    "TLS handshake: " + ec.message());
                                }
                                self->Send();
                              });
    } else {
      Send();
    }
  }

  void Send() {
    request_ = {http::verb::post, "/v1/completions", 11};
    request_.set(http::field::host, impl_.host);
    request_.set(http::field::content_type, "application/json");
    if (!impl_.authorization.empty()) request_.set(http::field::authorization, impl_.authorization);
    request_.body() = std::move(body_);
    request_.prepare_payload();
    http::async_write(stream_, request_,
                      [self = this->shared_from_this()](beast::error_code ec, size_t) {
                        self->OnWrite(ec);
                      });
  }

  void OnWrite(beast::error_code ec) {
    if (ec) return Fail(absl::StatusCode::kUnavailable, "write: " + ec.message());
    parser_.body_limit(std::numeric_limits<std::uint64_t>::max());  // a stream may be long
    on_chunk_ = [this](std::uint64_t, beast::string_view data, beast::error_code&) {
      pending_.append(data.data(), data.size());
      Events();
      return data.size();
    };
    parser_.on_chunk_body(on_chunk_);  // by reference: the member outlives the parser's use
    http::async_read_header(stream_, buffer_, parser_,
                            [self = this->shared_from_this()](beast::error_code ec, size_t) {
                              self->OnHeader(ec);
                            });
  }

  void OnHeader(beast::error_code ec) {
    if (ec) return Fail(absl::StatusCode::kUnavailable, "read: " + ec.message());
    status_ = parser_.get().result_int();
    ReadMore();
  }

  void ReadMore() {
    http::async_read_some(stream_, buffer_, parser_,
                          [self = this->shared_from_this()](beast::error_code ec, size_t) {
                            self->OnRead(ec);
                          });
  }

  void OnRead(beast::error_code ec) {
    if (ec == beast::error::timeout) return Fail(absl::StatusCode::kDeadlineExceeded, "timeout");
    if (ec) return Fail(absl::StatusCode::kUnavailable, "read: " + ec.message());
    if (!parser_.is_done()) return ReadMore();
    if (status_ != 200) {
      return Fail(CodeOfHttpStatus(status_),
                  absl::StrCat("HTTP ", status_, ": ", parser_.get().body()));
    }
    if (!error_.empty()) return Fail(absl::StatusCode::kInternal, error_);
    if (!done_ || !record_.got_complete) {
      return Fail(absl::StatusCode::kInternal, "the stream ended without a finish and [DONE]");
    }
    End(absl::StatusCode::kOk, "");
  }

  // Takes the complete SSE events out of `pending_`.
  void Events() {
    size_t end;
    while ((end = pending_.find("\n\n")) != std::string::npos) {
      const std::string event = pending_.substr(0, end);
      pending_.erase(0, end + 2);
      if (event.rfind("data: ", 0) != 0) continue;
      const std::string data = event.substr(6);
      if (data == "[DONE]") {
        done_ = true;
        continue;
      }
      const json v = json::parse(data, nullptr, /*allow_exceptions=*/false);
      if (v.is_discarded()) {
        error_ = "an event is not JSON: " + data;
        continue;
      }
      if (v.contains("error")) {
        error_ = v["error"].value("message", std::string("error event"));
        continue;
      }
      for (const json& c : v.value("choices", json::array())) {
        if (!c.value("text", std::string()).empty()) Token();
        if (c.contains("finish_reason") && !c["finish_reason"].is_null()) {
          record_.got_complete = true;
        }
      }
      if (v.contains("usage") && v["usage"].is_object()) {
        record_.prompt_tokens = v["usage"].value("prompt_tokens", 0);
        record_.completion_tokens = v["usage"].value("completion_tokens", 0);
      }
    }
  }

  void Token() {
    const double now = clock_.Now();
    if (record_.first_token_s < 0) {
      record_.first_token_s = now;
    } else {
      record_.itl_s.push_back(now - record_.last_token_s);
    }
    record_.last_token_s = now;
    ++record_.streamed_tokens;
  }

  void Fail(absl::StatusCode code, std::string message) { End(code, std::move(message)); }

  void End(absl::StatusCode code, std::string message) {
    record_.end_s = clock_.Now();
    record_.code = code;
    record_.error = std::move(message);
    beast::error_code ignored;
    // No TLS close_notify: the stream is done, and the server closes its side anyway.
    beast::get_lowest_layer(stream_).socket().shutdown(tcp::socket::shutdown_both, ignored);
    beast::get_lowest_layer(stream_).close();
    std::function<void(bool)> on_done = std::move(on_done_);
    on_done(code == absl::StatusCode::kOk);
  }

  HttpCalls::Impl& impl_;
  Stream<kTls> stream_;
  std::string body_;
  const std::chrono::steady_clock::time_point deadline_;
  const RunClock& clock_;
  RequestRecord& record_;
  std::function<void(bool)> on_done_;
  http::request<http::string_body> request_;
  beast::flat_buffer buffer_;
  std::function<size_t(std::uint64_t, beast::string_view, beast::error_code&)> on_chunk_;
  http::response_parser<http::string_body> parser_;
  int status_ = 0;
  std::string pending_;  // SSE bytes not yet a whole event
  bool done_ = false;    // data: [DONE]
  std::string error_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<HttpCalls>> HttpCalls::Create(const std::string& addr, int threads,
                                                             std::string authorization,
                                                             const std::string& ca_pem) {
  const size_t colon = addr.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(addr.substr(colon + 1), &port)) {
    return absl::InvalidArgumentError(absl::StrCat("\"", addr, "\" is not HOST:PORT"));
  }
  auto impl = std::make_unique<Impl>();
  impl->authorization = std::move(authorization);
  std::string host = addr.substr(0, colon);
  if (host.size() > 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
  beast::error_code ec;
  tcp::resolver resolver(impl->ioc);
  auto results = resolver.resolve(host, std::to_string(port), ec);
  if (ec || results.empty()) {
    return absl::UnavailableError(absl::StrCat("cannot resolve ", addr, ": ", ec.message()));
  }
  impl->endpoint = results.begin()->endpoint();
  impl->host = addr;
  impl->server_name = host;
  if (!ca_pem.empty()) {
    impl->tls.emplace(net::ssl::context::tls_client);
    impl->tls->add_certificate_authority(net::buffer(ca_pem), ec);
    if (ec) {
      return absl::InvalidArgumentError(
          absl::StrCat("--ca-file: not a PEM CA certificate: ", ec.message()));
    }
    impl->tls->set_verify_mode(net::ssl::verify_peer);
  }
  impl->work.emplace(impl->ioc.get_executor());
  for (int i = 0; i < std::max(1, threads); ++i) {
    impl->threads.emplace_back([ioc = &impl->ioc] { ioc->run(); });
  }
  return std::unique_ptr<HttpCalls>(new HttpCalls(std::move(impl)));
}

HttpCalls::HttpCalls(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpCalls::~HttpCalls() {
  impl_->work.reset();
  for (auto& t : impl_->threads) t.join();
}

namespace {

// GET `target` on a connection of its own, blocking.
template <bool kTls>
beast::error_code Get(HttpCalls::Impl& impl, const std::string& target, double timeout_s,
                      http::response<http::string_body>& res) {
  Stream<kTls> stream = NewStream<kTls>(impl, impl.ioc.get_executor());
  beast::get_lowest_layer(stream).expires_after(
      std::chrono::duration_cast<std::chrono::steady_clock::duration>(
          std::chrono::duration<double>(timeout_s)));
  beast::error_code ec;
  beast::get_lowest_layer(stream).socket().connect(impl.endpoint, ec);
  if constexpr (kTls) {
    if (!ec && !PrepareHandshake<kTls>(impl, stream).ok()) ec = net::error::invalid_argument;
    if (!ec) stream.handshake(net::ssl::stream_base::client, ec);
  }
  http::request<http::empty_body> req{http::verb::get, target, 11};
  req.set(http::field::host, impl.host);
  if (!impl.authorization.empty()) req.set(http::field::authorization, impl.authorization);
  if (!ec) http::write(stream, req, ec);
  beast::flat_buffer buffer;
  if (!ec) http::read(stream, buffer, res, ec);
  return ec;
}

}  // namespace

absl::StatusOr<HttpModelInfo> HttpCalls::GetModel(double timeout_s) {
  http::response<http::string_body> res;
  const beast::error_code ec = impl_->tls.has_value()
                                   ? Get<true>(*impl_, "/v1/models", timeout_s, res)
                                   : Get<false>(*impl_, "/v1/models", timeout_s, res);
  if (ec) {
    return absl::UnavailableError(absl::StrCat("GET /v1/models on ", impl_->host, ": ",
                                               ec.message()));
  }
  const json v = json::parse(res.body(), nullptr, /*allow_exceptions=*/false);
  if (res.result_int() != 200 || v.is_discarded() || !v.contains("data") ||
      !v["data"].is_array() || v["data"].empty()) {
    return absl::UnavailableError(absl::StrCat("GET /v1/models on ", impl_->host, ": HTTP ",
                                               res.result_int(), " ", res.body()));
  }
  const json& m = v["data"][0];
  return HttpModelInfo{.name = m.value("id", std::string()),
                       .context_length = m.value("max_model_len", int64_t{0})};
}

void HttpCalls::Start(const BenchRequest& request, std::chrono::duration<double> timeout,
                      const RunClock& clock, RequestRecord& record,
                      std::function<void(bool ok)> on_done) {
  json body = {{"max_tokens", request.max_tokens},
               {"temperature", 0},
               {"ignore_eos", true},
               {"stream", true},
               {"stream_options", {{"include_usage", true}}}};
  if (request.prompt_token_ids.empty()) {
    body["prompt"] = request.prompt;
  } else {
    body["prompt"] = request.prompt_token_ids;
  }
  const auto deadline =
      std::chrono::steady_clock::now() +
      std::chrono::duration_cast<std::chrono::steady_clock::duration>(timeout);
  if (impl_->tls.has_value()) {
    std::make_shared<StreamCall<true>>(*impl_, body.dump(), deadline, clock, record,
                                       std::move(on_done))
        ->Run();
  } else {
    std::make_shared<StreamCall<false>>(*impl_, body.dump(), deadline, clock, record,
                                        std::move(on_done))
        ->Run();
  }
}

}  // namespace tandem::bench
