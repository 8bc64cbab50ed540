// The open-loop driver: sends each request at its scheduled time, whether or not earlier ones
// have finished, and collects one RequestRecord per request. Requests go through
// tandem.v1.Inference/Generate over a few gRPC connections, or (api "http") as streaming
// POST /v1/completions calls, a connection each (http_calls.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/serving/dataset.h"
#include "bench/serving/http_calls.h"
#include "bench/serving/progress_bar.h"
#include "bench/serving/request_record.h"
#include "tandem/v1/inference.grpc.pb.h"

namespace tandem::bench {

struct LoadOptions {
  // Requests in flight at most; 0 = unlimited. A request whose time has come waits for a slot,
  // as vLLM's --max-concurrency does; the wait shows up as send delay, not as latency.
  int64_t max_concurrency = 0;
  double timeout_s = 600;  // deadline of every call
  // Called on the sending thread about every 100 ms while the run lasts, and once at the end
  // with `final` set. May be empty.
  std::function<void(const Progress&, bool final)> on_progress{};
};

struct LoadResult {
  std::vector<RequestRecord> records;  // in send order
  double duration_s = 0;               // start of the run to the end of the last request
};

// Threads: Run sends from the calling thread; the calls' reactions run on gRPC's threads.
// Run returns only after every call has ended (each has a deadline, so it does return).
class LoadClient {
 public:
  // `connections` channels to `addr` (HOST:PORT), each its own TCP connection, used round
  // robin, so one HTTP/2 connection's stream limit or flow control does not cap the load. With
  // `api` "http", `addr` is an OpenAI-compatible HTTP server and `connections` its I/O threads.
  // `authorization`: the header every request carries ("Bearer KEY"; empty: none). `ca_pem`:
  // gRPC over TLS trusting this CA (empty: plaintext).
  LoadClient(const std::string& addr, int connections, const std::string& api = "grpc",
             std::string authorization = "", const std::string& ca_pem = "");
  ~LoadClient();

  // Opens every connection, so the first requests of a run do not pay for TCP and HTTP/2
  // setup; UNAVAILABLE naming the address when one is not ready within `timeout_s`.
  absl::Status Connect(double timeout_s);

  absl::StatusOr<tandem::v1::ModelInfo> GetModelInfo(double timeout_s);

  // Sends requests[i] at offsets_s[i] seconds after the start (the shorter list decides how
  // many are sent).
  LoadResult Run(const std::vector<BenchRequest>& requests, const std::vector<double>& offsets_s,
                 const LoadOptions& options);

 private:
  std::string addr_;
  const int connections_;
  const std::string authorization_;
  const std::string ca_pem_;  // HTTPS (--api http) or TLS (grpc); empty: plaintext
  std::unique_ptr<HttpCalls> http_;  // api "http"
  std::vector<std::shared_ptr<grpc::Channel>> channels_;
  std::vector<std::unique_ptr<tandem::v1::Inference::Stub>> stubs_;
};

}  // namespace tandem::bench
