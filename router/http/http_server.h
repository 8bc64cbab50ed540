// An HTTP/1.1 server on Boost.Beast over Asio: event-driven, so an idle keep-alive connection
// or a long SSE stream costs a socket and a few buffers, never a thread.
//
// The server reads and checks requests (header and body limits, read timeouts), hands each to
// the handler with an HttpResponder, and writes what the responder is given: a whole response,
// or a stream (chunked transfer encoding). It also answers CORS preflights (cors_origins). A client that goes away, stops reading (write
// timeout, or more than `max_pending_write_bytes` waiting) or sends nothing in time is cut off,
// and the responder's abort callback runs, so whatever serves the request can stop.
//
// Threads: `threads` I/O threads run every connection; each connection's work runs on its own
// strand. The handler runs on an I/O thread and must not block. HttpResponder may be used from
// any thread; its calls only queue work on the connection's strand.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::router {

struct HttpServerOptions {
  std::string listen = "";  // HOST:PORT; port 0 picks a free one
  int threads = 1;
  size_t max_header_bytes = 16 << 10;
  size_t max_body_bytes = 4 << 20;  // larger bodies get 413
  // Time to receive one whole request, counted from its first byte or, on a kept-alive
  // connection, from the end of the previous response (idle connections close after it).
  std::chrono::milliseconds read_timeout{30000};
  // Time one write may take: a client that stops reading its stream is cut off after it.
  std::chrono::milliseconds write_timeout{30000};
  // Response bytes queued and not yet written before the client counts as not reading.
  size_t max_pending_write_bytes = 8 << 20;
  int max_connections = 10000;  // further connections are closed at once
  // TLS: the server's certificate chain and key (PEM). Both empty: plaintext. The files are
  // read again for new connections once they change (rotation without a restart).
  std::string tls_cert_file = "";
  std::string tls_key_file = "";
  // CORS: the origins (scheme://host[:port]) whose pages a browser lets read the responses, or
  // "*" for any. A response to an allowed Origin carries Access-Control-Allow-Origin; the
  // server answers preflight requests (OPTIONS with Access-Control-Request-Method) itself, 204
  // for an allowed origin and 403 otherwise, before the handler (and so before any API key
  // check: browsers send none with a preflight). Empty: no CORS headers, preflights get 403.
  std::vector<std::string> cors_origins = {};
  // Runs when a client is cut off for not reading (write_timeout, max_pending_write_bytes).
  std::function<void()> on_client_cut_off = nullptr;
  // The body of a response the server makes itself (413, 431, 408, 400 for malformed HTTP),
  // as {content type, body}; null: plain text.
  std::function<std::pair<std::string, std::string>(int status, const std::string& message)>
      refusal_body = nullptr;
};

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

struct HttpRequest {
  std::string method;  // GET, POST, ...
  std::string target;  // the path and query, as sent
  HttpHeaders headers;
  std::string body;
  // The first value of header `name` (case-insensitive); empty when absent.
  std::string Header(std::string_view name) const;
};

// The answer to one request. Either Reply once, or StartStream, then Write any number of times,
// then EndStream. Calls after the response ended (or after the client went away) are dropped.
class HttpResponder {
 public:
  virtual ~HttpResponder() = default;
  virtual void Reply(int status, std::string content_type, std::string body,
                     HttpHeaders headers = {}) = 0;
  virtual void StartStream(int status, std::string content_type, HttpHeaders headers = {}) = 0;
  virtual void Write(std::string data) = 0;
  virtual void EndStream() = 0;
  // `on_abort` runs once, on an I/O thread, if the connection ends before the response has;
  // at once if it already has.
  virtual void OnAbort(std::function<void()> on_abort) = 0;
};

using HttpHandler = std::function<void(HttpRequest, std::shared_ptr<HttpResponder>)>;

class HttpServer {
 public:
  // Binds and starts serving; InvalidArgument for a bad address or TLS files that do not load,
  // Unavailable when the port is taken.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const HttpServerOptions& options,
                                                           HttpHandler handler);
  // Stops: closes the listener and every connection (responses in progress are aborted), then
  // joins the I/O threads.
  ~HttpServer();

  int port() const;
  // Connections open now.
  int connections() const;

  struct Impl;

 private:
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// HOST:PORT split, for the listener and for tests; InvalidArgument when it is not one.
absl::StatusOr<std::pair<std::string, int>> SplitHostPort(std::string_view address);

}  // namespace tandem::router
