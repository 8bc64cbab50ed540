// The load generator's HTTP side: streaming POST /v1/completions calls to an OpenAI-compatible
// server (Tandem's HTTP front door, or any other), each on its own HTTP/1.1 connection, driven
// by Boost.Beast on a few I/O threads: no thread per call, so a thousand concurrent streams cost
// a thousand sockets and small objects.
//
// A call sends the request as the gRPC side does (the prompt, max_tokens, greedy, ignore_eos)
// with stream and stream_options.include_usage, and fills its RequestRecord from the SSE
// events: each event with text counts as one token (the server sends one per token, except that
// bytes of a character split across tokens arrive with the token that completes it), and the
// final usage event gives the prompt and completion token counts.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "bench/serving/dataset.h"
#include "bench/serving/generate_call.h"
#include "bench/serving/request_record.h"

namespace tandem::bench {

struct HttpModelInfo {
  std::string name;
  int64_t context_length = 0;  // max_model_len
};

class HttpCalls {
 public:
  // `addr` is HOST:PORT; `threads` I/O threads run every call.
  // `authorization`: the Authorization header of every request ("Bearer KEY"); empty: none.
  // `ca_pem`: HTTPS, the server's certificate verified against this CA and the host in `addr`;
  // empty: plain HTTP.
  static absl::StatusOr<std::unique_ptr<HttpCalls>> Create(const std::string& addr, int threads,
                                                           std::string authorization = "",
                                                           const std::string& ca_pem = "");
  // Joins the I/O threads; every call must have ended.
  ~HttpCalls();

  // GET /v1/models: the first model.
  absl::StatusOr<HttpModelInfo> GetModel(double timeout_s);

  // Starts one streaming completion; `on_done(ok)` runs last, after the record is complete.
  void Start(const BenchRequest& request, std::chrono::duration<double> timeout,
             const RunClock& clock, RequestRecord& record, std::function<void(bool ok)> on_done);

  struct Impl;

 private:
  explicit HttpCalls(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::bench
