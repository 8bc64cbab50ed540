#include "router/http/http_server.h"

#include <sys/stat.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <charconv>
#include <deque>
#include <optional>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/util/log.h"

namespace tandem::router {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

class Session;

// The server's TLS context, made again from the files when they change. Sessions keep the
// context they started with.
class TlsFiles {
 public:
  TlsFiles(std::string cert_file, std::string key_file)
      : cert_file_(std::move(cert_file)), key_file_(std::move(key_file)) {}

  // The context for a new connection; the last good one if the files changed into something
  // that does not load (logged).
  absl::StatusOr<std::shared_ptr<net::ssl::context>> Current() {
    const std::pair<int64_t, int64_t> stamp = {Stamp(cert_file_), Stamp(key_file_)};
    absl::MutexLock lock(&mu_);
    if (context_ != nullptr && stamp == stamp_) return context_;
    absl::StatusOr<std::shared_ptr<net::ssl::context>> made = Make();
    if (!made.ok()) {
      if (context_ == nullptr) return made.status();
      Log(LogLevel::kWarning, "http",
          absl::StrCat("keeping the previous TLS certificate: ", made.status().message()));
    } else {
      context_ = *std::move(made);
    }
    stamp_ = stamp;
    return context_;
  }

 private:
  // Modification time in nanoseconds, following symlinks (a Kubernetes Secret swaps one).
  static int64_t Stamp(const std::string& path) {
    struct stat st;
    if (stat(path.c_str(), &st) != 0) return -1;
    return int64_t{st.st_mtim.tv_sec} * 1'000'000'000 + st.st_mtim.tv_nsec;
  }
  absl::StatusOr<std::shared_ptr<net::ssl::context>> Make() const {
    auto context = std::make_shared<net::ssl::context>(net::ssl::context::tls_server);
    context->set_options(net::ssl::context::default_workarounds | net::ssl::context::no_sslv2 |
                         net::ssl::context::no_sslv3 | net::ssl::context::no_tlsv1 |
                         net::ssl::context::no_tlsv1_1);
    beast::error_code ec;
    context->use_certificate_chain_file(cert_file_, ec);
    if (ec) {
      return absl::InvalidArgumentError(
          absl::StrCat("HTTPS certificate ", cert_file_, ": ", ec.message()));
    }
    context->use_private_key_file(key_file_, net::ssl::context::pem, ec);
    if (ec) {
      return absl::InvalidArgumentError(absl::StrCat("HTTPS key ", key_file_, ": ", ec.message()));
    }
    return context;
  }

  const std::string cert_file_;
  const std::string key_file_;
  absl::Mutex mu_;
  std::shared_ptr<net::ssl::context> context_ ABSL_GUARDED_BY(mu_);
  std::pair<int64_t, int64_t> stamp_ ABSL_GUARDED_BY(mu_);
};

// A connection's byte stream: TCP, or TLS over it. Beast's algorithms see one stream type
// either way; timeouts and closing act on the TCP stream beneath (lower()).
class ConnStream {
 public:
  using executor_type = beast::tcp_stream::executor_type;

  ConnStream(tcp::socket socket, std::shared_ptr<net::ssl::context> tls) : tls_context_(tls) {
    if (tls_context_ != nullptr) {
      tls_.emplace(std::move(socket), *tls_context_);
    } else {
      plain_.emplace(std::move(socket));
    }
  }

  bool tls() const { return tls_.has_value(); }
  beast::tcp_stream& lower() { return tls_ ? tls_->next_layer() : *plain_; }
  executor_type get_executor() { return lower().get_executor(); }

  template <typename Buffers, typename Handler>
  void async_read_some(const Buffers& buffers, Handler&& handler) {
    if (tls_) {
      tls_->async_read_some(buffers, std::forward<Handler>(handler));
    } else {
      plain_->async_read_some(buffers, std::forward<Handler>(handler));
    }
  }
  template <typename Buffers, typename Handler>
  void async_write_some(const Buffers& buffers, Handler&& handler) {
    if (tls_) {
      tls_->async_write_some(buffers, std::forward<Handler>(handler));
    } else {
      plain_->async_write_some(buffers, std::forward<Handler>(handler));
    }
  }
  template <typename Handler>
  void async_handshake(Handler&& handler) {
    tls_->async_handshake(net::ssl::stream_base::server, std::forward<Handler>(handler));
  }

 private:
  std::shared_ptr<net::ssl::context> tls_context_;  // outlives tls_
  std::optional<beast::ssl_stream<beast::tcp_stream>> tls_;
  std::optional<beast::tcp_stream> plain_;
};

// Lets responders post to connections only while the I/O context lives: the server closes it
// (waiting out posts in progress) before the context goes.
struct PostGate {
  absl::Mutex mu;
  bool open ABSL_GUARDED_BY(mu) = true;
};

}  // namespace

struct HttpServer::Impl {
  Impl(const HttpServerOptions& o, HttpHandler h)
      : options(o), handler(std::move(h)), ioc(std::max(1, o.threads)) {}

  void Accept();
  void Track(const std::shared_ptr<Session>& session);

  const HttpServerOptions options;
  const HttpHandler handler;
  std::unique_ptr<TlsFiles> tls;  // null: plaintext
  net::io_context ioc;
  std::optional<tcp::acceptor> acceptor;
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work;
  std::vector<std::thread> threads;
  std::shared_ptr<PostGate> gate = std::make_shared<PostGate>();
  int port = 0;
  absl::Mutex mu;
  int connections ABSL_GUARDED_BY(mu) = 0;
  std::vector<std::weak_ptr<Session>> sessions ABSL_GUARDED_BY(mu);
};

namespace {

// One connection: reads requests one at a time and writes their responses, all on its strand.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, std::shared_ptr<net::ssl::context> tls, HttpServer::Impl& server)
      : stream_(std::move(socket), std::move(tls)),
        read_timer_(stream_.get_executor()),
        server_(server),
        options_(server.options) {
    absl::MutexLock lock(&server_.mu);
    ++server_.connections;
  }
  ~Session() {
    if (on_abort_) on_abort_();  // the server stopped with a response in progress
    absl::MutexLock lock(&server_.mu);
    --server_.connections;
  }

  void Run() {
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->Handshake(); });
  }
  // From any thread: cut the connection off (the server is stopping).
  void Kill() {
    net::post(stream_.get_executor(), [self = shared_from_this()] { self->Abort(); });
  }

  // The responder's calls, on the strand. `generation` names the request they answer.
  void Reply(uint64_t generation, int status, std::string content_type, std::string body,
             HttpHeaders headers);
  void StartStream(uint64_t generation, int status, std::string content_type,
                   HttpHeaders headers);
  void Write(uint64_t generation, std::string data);
  void EndStream(uint64_t generation);
  void SetAbort(uint64_t generation, std::function<void()> on_abort);

  net::any_io_executor executor() { return stream_.get_executor(); }

 private:
  struct Out {
    enum Kind { kFull, kHead, kData, kLast } kind = kFull;
    std::unique_ptr<http::response<http::string_body>> full = nullptr;
    std::unique_ptr<http::response<http::empty_body>> head = nullptr;
    std::string data = "";
  };

  bool Answering(uint64_t generation) const {
    return !closed_ && in_request_ && generation == generation_;
  }
  // TLS: the handshake, within the read timeout; then requests.
  void Handshake();
  void ReadHeader();
  void OnHeader(beast::error_code ec);
  void ReadBody();
  void OnRequest(beast::error_code ec);
  // A response the server itself makes (a request it refused); the connection closes after.
  void Refuse(int status, std::string message);
  void Enqueue(Out out);
  void DoWrite();
  void OnWrite(beast::error_code ec, Out::Kind kind);
  void FinishResponse();
  void Watch();
  void OnWatch(beast::error_code ec, size_t n);
  void Abort();
  void Close();
  template <typename Body>
  void AddHeaders(http::response<Body>& res, const HttpHeaders& headers) {
    for (const auto& [name, value] : headers) res.set(name, value);
    res.set(http::field::server, "tandem");
    if (!cors_allow_origin_.empty()) {
      res.set(http::field::access_control_allow_origin, cors_allow_origin_);
    }
    // Caches must not hand one origin's answer to another.
    if (!options_.cors_origins.empty()) res.set(http::field::vary, "Origin");
    res.keep_alive(keep_alive_);
  }
  // What Access-Control-Allow-Origin says to `origin`: empty when it is not allowed.
  std::string AllowedOrigin(const std::string& origin) const;
  // A CORS preflight, answered here.
  void Preflight(const http::request<http::string_body>& req);

  ConnStream stream_;
  // The read timeout cancels the read rather than closing (as the stream's own timer would), so
  // a client that stalled mid-request still hears 408.
  net::steady_timer read_timer_;
  bool read_timed_out_ = false;
  HttpServer::Impl& server_;
  const HttpServerOptions& options_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  uint64_t generation_ = 0;
  bool in_request_ = false;  // handed to the handler; its response has not ended
  std::string cors_allow_origin_;  // the current request's, when its Origin is allowed
  bool started_ = false;     // the response's head is queued
  bool keep_alive_ = false;
  bool chunked_ = true;  // HTTP/1.1; an HTTP/1.0 stream ends by closing
  bool watching_ = false;
  bool want_next_ = false;
  bool writing_ = false;
  bool closed_ = false;
  std::deque<Out> out_;
  size_t pending_bytes_ = 0;
  Out current_;  // being written
  std::optional<http::response_serializer<http::empty_body>> head_serializer_;
  std::function<void()> on_abort_;
};

class Responder final : public HttpResponder {
 public:
  Responder(std::weak_ptr<Session> session, uint64_t generation, std::shared_ptr<PostGate> gate)
      : session_(std::move(session)), generation_(generation), gate_(std::move(gate)) {}

  void Reply(int status, std::string content_type, std::string body,
             HttpHeaders headers) override {
    Post([g = generation_, status, body = std::move(body), content_type = std::move(content_type),
          headers = std::move(headers)](Session& s) mutable {
      s.Reply(g, status, std::move(content_type), std::move(body), std::move(headers));
    });
  }
  void StartStream(int status, std::string content_type, HttpHeaders headers) override {
    Post([g = generation_, status, content_type = std::move(content_type),
          headers = std::move(headers)](Session& s) mutable {
      s.StartStream(g, status, std::move(content_type), std::move(headers));
    });
  }
  void Write(std::string data) override {
    Post([g = generation_, data = std::move(data)](Session& s) mutable {
      s.Write(g, std::move(data));
    });
  }
  void EndStream() override {
    Post([g = generation_](Session& s) { s.EndStream(g); });
  }
  void OnAbort(std::function<void()> on_abort) override {
    Post([g = generation_, on_abort = std::move(on_abort)](Session& s) mutable {
      s.SetAbort(g, std::move(on_abort));
    });
  }

 private:
  // Runs `f` on the connection's strand, if the connection and the server are still there.
  template <typename F>
  void Post(F f) {
    absl::ReaderMutexLock lock(&gate_->mu);
    if (!gate_->open) return;
    std::shared_ptr<Session> session = session_.lock();
    if (session == nullptr) return;
    net::post(session->executor(), [session, f = std::move(f)]() mutable { f(*session); });
  }

  const std::weak_ptr<Session> session_;
  const uint64_t generation_;
  const std::shared_ptr<PostGate> gate_;
};

void Session::Handshake() {
  if (!stream_.tls()) {
    ReadHeader();
    return;
  }
  stream_.lower().expires_after(options_.read_timeout);
  stream_.async_handshake([self = shared_from_this()](beast::error_code ec) {
    if (ec) {  // not TLS, a bad client, or too slow: nothing can be said to it
      self->Close();
      return;
    }
    self->ReadHeader();
  });
}

void Session::ReadHeader() {
  if (closed_) return;
  parser_.emplace();
  parser_->header_limit(static_cast<uint32_t>(options_.max_header_bytes));
  parser_->body_limit(options_.max_body_bytes);
  stream_.lower().expires_never();
  read_timed_out_ = false;
  read_timer_.expires_after(options_.read_timeout);
  read_timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
    if (ec) return;  // cancelled: the request arrived
    self->read_timed_out_ = true;
    beast::error_code ignored;
    self->stream_.lower().socket().cancel(ignored);
  });
  http::async_read_header(stream_, buffer_, *parser_,
                          [self = shared_from_this()](beast::error_code ec, size_t) {
                            self->OnHeader(ec);
                          });
}

void Session::OnHeader(beast::error_code ec) {
  if (ec) {
    OnRequest(ec);
    return;
  }
  // curl and others wait for "100 Continue" before sending a large body.
  const auto& req = parser_->get();
  if (req.version() >= 11 && absl::EqualsIgnoreCase(std::string(req[http::field::expect]),
                                                     "100-continue")) {
    auto cont = std::make_shared<http::response<http::empty_body>>(http::status::continue_, 11);
    http::async_write(stream_, *cont,
                      [self = shared_from_this(), cont](beast::error_code ec, size_t) {
                        if (ec) {
                          self->Close();
                        } else {
                          self->ReadBody();
                        }
                      });
    return;
  }
  ReadBody();
}

void Session::ReadBody() {
  stream_.lower().expires_never();
  http::async_read(stream_, buffer_, *parser_,
                   [self = shared_from_this()](beast::error_code ec, size_t) {
                     self->OnRequest(ec);
                   });
}

void Session::OnRequest(beast::error_code ec) {
  read_timer_.cancel();
  if (read_timed_out_ && ec) ec = beast::error::timeout;
  if (ec == http::error::body_limit) {
    Refuse(413, absl::StrCat("the request body is larger than ", options_.max_body_bytes,
                             " bytes"));
    return;
  }
  if (ec == http::error::header_limit) {
    Refuse(431, absl::StrCat("the request header is larger than ", options_.max_header_bytes,
                             " bytes"));
    return;
  }
  if (ec == beast::error::timeout) {
    // A client that stalled mid-request hears why; an idle kept-alive one is just closed.
    if (parser_->got_some()) {
      Refuse(408, "the request did not arrive in time");
    } else {
      Close();
    }
    return;
  }
  if (ec == http::error::end_of_stream || ec == net::error::eof ||
      ec == net::error::connection_reset || ec == net::error::operation_aborted) {
    Close();
    return;
  }
  if (ec) {
    Refuse(400, absl::StrCat("malformed HTTP request: ", ec.message()));
    return;
  }
  http::request<http::string_body> req = parser_->release();
  parser_.reset();
  keep_alive_ = req.keep_alive();
  chunked_ = req.version() >= 11;
  in_request_ = true;
  started_ = false;
  ++generation_;
  const auto origin = req.find(http::field::origin);
  cors_allow_origin_ = origin == req.end() ? "" : AllowedOrigin(std::string(origin->value()));
  if (req.method() == http::verb::options &&
      req.find(http::field::access_control_request_method) != req.end()) {
    Preflight(req);
    return;
  }
  HttpRequest request;
  request.method = std::string(req.method_string());
  request.target = std::string(req.target());
  for (const auto& field : req) {
    request.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
  }
  request.body = std::move(req.body());
  Watch();
  server_.handler(std::move(request), std::make_shared<Responder>(weak_from_this(), generation_,
                                                                   server_.gate));
}

std::string Session::AllowedOrigin(const std::string& origin) const {
  for (const std::string& allowed : options_.cors_origins) {
    if (allowed == "*") return "*";
    if (absl::EqualsIgnoreCase(allowed, origin)) return origin;
  }
  return "";
}

void Session::Preflight(const http::request<http::string_body>& req) {
  if (cors_allow_origin_.empty()) {
    const auto origin = req.find(http::field::origin);
    Reply(generation_, 403, "text/plain",
          absl::StrCat("cross-origin requests from ",
                       origin == req.end() ? "no origin" : std::string(origin->value()),
                       " are not allowed (router.http_cors_origins)\n"),
          {});
    return;
  }
  HttpHeaders headers = {{"Access-Control-Allow-Methods", "GET, POST, OPTIONS"},
                         {"Access-Control-Max-Age", "600"}};
  // The headers the page asked to send (Authorization, Content-Type, the SDKs' own): the
  // origin is trusted, and every request is still checked as it arrives.
  if (const auto asked = req.find(http::field::access_control_request_headers);
      asked != req.end()) {
    headers.emplace_back("Access-Control-Allow-Headers", std::string(asked->value()));
  }
  Reply(generation_, 204, "text/plain", "", std::move(headers));
}

void Session::Refuse(int status, std::string message) {
  keep_alive_ = false;
  cors_allow_origin_.clear();
  in_request_ = true;
  started_ = false;
  ++generation_;
  if (options_.refusal_body) {
    auto [type, body] = options_.refusal_body(status, message);
    Reply(generation_, status, std::move(type), std::move(body), {});
  } else {
    Reply(generation_, status, "text/plain", message + "\n", {});
  }
}

void Session::Reply(uint64_t generation, int status, std::string content_type, std::string body,
                    HttpHeaders headers) {
  if (!Answering(generation) || started_) return;
  started_ = true;
  Out out{.kind = Out::kFull};
  out.full = std::make_unique<http::response<http::string_body>>(
      static_cast<http::status>(status), 11);
  AddHeaders(*out.full, headers);
  out.full->set(http::field::content_type, content_type);
  out.full->body() = std::move(body);
  out.full->prepare_payload();
  pending_bytes_ += out.full->body().size();
  Enqueue(std::move(out));
}

void Session::StartStream(uint64_t generation, int status, std::string content_type,
                          HttpHeaders headers) {
  if (!Answering(generation) || started_) return;
  started_ = true;
  Out out{.kind = Out::kHead};
  out.head = std::make_unique<http::response<http::empty_body>>(
      static_cast<http::status>(status), 11);
  AddHeaders(*out.head, headers);
  out.head->set(http::field::content_type, content_type);
  out.head->set(http::field::cache_control, "no-cache");
  if (chunked_) {
    out.head->chunked(true);
  } else {
    keep_alive_ = false;  // the body ends where the connection does
    out.head->keep_alive(false);
  }
  Enqueue(std::move(out));
}

void Session::Write(uint64_t generation, std::string data) {
  if (!Answering(generation) || !started_ || data.empty()) return;
  pending_bytes_ += data.size();
  if (pending_bytes_ > options_.max_pending_write_bytes) {
    Log(LogLevel::kWarning, "http",
        absl::StrCat("a client is not reading its stream (", pending_bytes_,
                     " bytes waiting); closing the connection"));
    if (options_.on_client_cut_off) options_.on_client_cut_off();
    Abort();
    return;
  }
  if (!out_.empty() && out_.back().kind == Out::kData) {
    out_.back().data += data;  // one chunk for what piled up
    return;
  }
  Enqueue(Out{.kind = Out::kData, .data = std::move(data)});
}

void Session::EndStream(uint64_t generation) {
  if (!Answering(generation) || !started_) return;
  Enqueue(Out{.kind = Out::kLast});
}

void Session::SetAbort(uint64_t generation, std::function<void()> on_abort) {
  if (Answering(generation)) {
    on_abort_ = std::move(on_abort);
  } else if (closed_ && generation == generation_ && in_request_) {
    on_abort();  // the client is already gone
  }
}

void Session::Enqueue(Out out) {
  out_.push_back(std::move(out));
  DoWrite();
}

void Session::DoWrite() {
  if (writing_ || closed_ || out_.empty()) return;
  writing_ = true;
  current_ = std::move(out_.front());
  out_.pop_front();
  stream_.lower().expires_after(options_.write_timeout);
  auto done = [self = shared_from_this(), kind = current_.kind](beast::error_code ec, size_t) {
    self->OnWrite(ec, kind);
  };
  switch (current_.kind) {
    case Out::kFull:
      http::async_write(stream_, *current_.full, std::move(done));
      break;
    case Out::kHead:
      head_serializer_.emplace(*current_.head);
      http::async_write_header(stream_, *head_serializer_, std::move(done));
      break;
    case Out::kData:
      if (chunked_) {
        net::async_write(stream_, http::make_chunk(net::buffer(current_.data)), std::move(done));
      } else {
        net::async_write(stream_, net::buffer(current_.data), std::move(done));
      }
      break;
    case Out::kLast:
      if (chunked_) {
        net::async_write(stream_, http::make_chunk_last(), std::move(done));
      } else {
        net::post(stream_.get_executor(), [done = std::move(done)]() mutable {
          done(beast::error_code(), 0);
        });
      }
      break;
  }
}

void Session::OnWrite(beast::error_code ec, Out::Kind kind) {
  writing_ = false;
  if (ec) {
    if (ec == beast::error::timeout && options_.on_client_cut_off) options_.on_client_cut_off();
    Abort();
    return;
  }
  if (kind == Out::kFull) pending_bytes_ -= std::min(pending_bytes_, current_.full->body().size());
  if (kind == Out::kData) pending_bytes_ -= std::min(pending_bytes_, current_.data.size());
  current_ = Out{};
  head_serializer_.reset();
  if (kind == Out::kFull || kind == Out::kLast) {
    FinishResponse();
    return;
  }
  DoWrite();
}

void Session::FinishResponse() {
  in_request_ = false;
  on_abort_ = nullptr;
  pending_bytes_ = 0;
  if (!keep_alive_) {
    Close();
    return;
  }
  if (watching_) {
    want_next_ = true;  // OnWatch reads the next request once the watch is cancelled
    beast::error_code ignored;
    stream_.lower().socket().cancel(ignored);
    return;
  }
  ReadHeader();
}

// While a request is served, a read notices the client leaving (a pipelined next request is
// kept in buffer_ for the parser).
void Session::Watch() {
  if (watching_ || closed_) return;
  if (buffer_.size() >= options_.max_header_bytes + options_.max_body_bytes) return;
  watching_ = true;
  stream_.lower().expires_never();
  stream_.async_read_some(buffer_.prepare(4096),
                          [self = shared_from_this()](beast::error_code ec, size_t n) {
                            self->OnWatch(ec, n);
                          });
}

void Session::OnWatch(beast::error_code ec, size_t n) {
  watching_ = false;
  if (!ec) buffer_.commit(n);
  if (want_next_) {
    want_next_ = false;
    if (!ec || ec == net::error::operation_aborted) {
      ReadHeader();
    } else {
      Close();
    }
    return;
  }
  if (ec) {
    Abort();
    return;
  }
  if (in_request_) Watch();
}

void Session::Abort() {
  if (closed_) return;
  Close();
  if (in_request_ && on_abort_) {
    std::function<void()> on_abort = std::move(on_abort_);
    on_abort_ = nullptr;
    on_abort();
  }
}

void Session::Close() {
  if (closed_) return;
  closed_ = true;
  out_.clear();
  read_timer_.cancel();
  beast::error_code ignored;
  stream_.lower().socket().shutdown(tcp::socket::shutdown_both, ignored);
  stream_.lower().close();
}

}  // namespace

void HttpServer::Impl::Accept() {
  acceptor->async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
    if (ec == net::error::operation_aborted || !acceptor->is_open()) return;
    if (!ec) {
      bool full = false;
      {
        absl::MutexLock lock(&mu);
        full = connections >= options.max_connections;
      }
      if (full) {
        beast::error_code ignored;
        socket.close(ignored);
      } else {
        beast::error_code ignored;
        socket.set_option(tcp::no_delay(true), ignored);  // SSE events go out at once
        std::shared_ptr<net::ssl::context> context;
        if (tls != nullptr) {
          absl::StatusOr<std::shared_ptr<net::ssl::context>> current = tls->Current();
          if (current.ok()) context = *std::move(current);
        }
        if (tls != nullptr && context == nullptr) {
          beast::error_code ignored;
          socket.close(ignored);
        } else {
          auto session = std::make_shared<Session>(std::move(socket), std::move(context), *this);
          Track(session);
          session->Run();
        }
      }
    }
    Accept();
  });
}

void HttpServer::Impl::Track(const std::shared_ptr<Session>& session) {
  absl::MutexLock lock(&mu);
  std::erase_if(sessions, [](const std::weak_ptr<Session>& s) { return s.expired(); });
  sessions.push_back(session);
}

absl::StatusOr<std::pair<std::string, int>> SplitHostPort(std::string_view address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string_view::npos || colon == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", std::string(address), "\" is not HOST:PORT"));
  }
  std::string host(address.substr(0, colon));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  const std::string_view port_text = address.substr(colon + 1);
  int port = -1;
  const auto [end, err] = std::from_chars(port_text.data(), port_text.data() + port_text.size(),
                                          port);
  if (err != std::errc() || end != port_text.data() + port_text.size() || port < 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", std::string(address), "\": the port is not a number in [0, 65535]"));
  }
  return std::make_pair(host, port);
}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const HttpServerOptions& options,
                                                             HttpHandler handler) {
  absl::StatusOr<std::pair<std::string, int>> hp = SplitHostPort(options.listen);
  if (!hp.ok()) return hp.status();
  auto impl = std::make_unique<Impl>(options, std::move(handler));
  if (!options.tls_cert_file.empty() || !options.tls_key_file.empty()) {
    impl->tls = std::make_unique<TlsFiles>(options.tls_cert_file, options.tls_key_file);
    absl::StatusOr<std::shared_ptr<net::ssl::context>> first = impl->tls->Current();
    if (!first.ok()) return first.status();
  }
  beast::error_code ec;
  tcp::resolver resolver(impl->ioc);
  auto endpoints = resolver.resolve(hp->first, std::to_string(hp->second),
                                    tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec || endpoints.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("cannot resolve \"", options.listen,
                                                   "\": ", ec.message()));
  }
  const tcp::endpoint endpoint = endpoints.begin()->endpoint();
  impl->acceptor.emplace(net::make_strand(impl->ioc));
  tcp::acceptor& a = *impl->acceptor;
  a.open(endpoint.protocol(), ec);
  if (!ec) a.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) a.bind(endpoint, ec);
  if (!ec) a.listen(net::socket_base::max_listen_connections, ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options.listen, ": ", ec.message()));
  }
  impl->port = a.local_endpoint().port();
  impl->work.emplace(impl->ioc.get_executor());
  impl->Accept();
  for (int i = 0; i < std::max(1, options.threads); ++i) {
    impl->threads.emplace_back([ioc = &impl->ioc] { ioc->run(); });
  }
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpServer::~HttpServer() {
  absl::Notification closed;
  net::post(impl_->acceptor->get_executor(), [this, &closed] {
    beast::error_code ignored;
    impl_->acceptor->close(ignored);
    closed.Notify();
  });
  closed.WaitForNotification();
  std::vector<std::shared_ptr<Session>> live;
  {
    absl::MutexLock lock(&impl_->mu);
    for (auto& w : impl_->sessions) {
      if (auto s = w.lock()) live.push_back(std::move(s));
    }
    impl_->sessions.clear();
  }
  for (auto& s : live) s->Kill();
  live.clear();
  // Connections close as their aborts run; wait a moment for them, then stop regardless.
  {
    absl::MutexLock lock(&impl_->mu);
    Impl* impl = impl_.get();
    impl_->mu.AwaitWithTimeout(absl::Condition(
                                   +[](Impl* i) ABSL_NO_THREAD_SAFETY_ANALYSIS {
                                     return i->connections == 0;
                                   },
                                   impl),
                               absl::Seconds(2));
  }
  {
    absl::MutexLock lock(&impl_->gate->mu);
    impl_->gate->open = false;
  }
  impl_->work.reset();
  impl_->ioc.stop();
  for (auto& t : impl_->threads) t.join();
}

int HttpServer::port() const { return impl_->port; }

int HttpServer::connections() const {
  absl::MutexLock lock(&impl_->mu);
  return impl_->connections;
}

std::string HttpRequest::Header(std::string_view name) const {
  for (const auto& [n, v] : headers) {
    if (absl::EqualsIgnoreCase(n, std::string(name))) return v;
  }
  return {};
}

}  // namespace tandem::router
