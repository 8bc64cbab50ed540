// What the load generator measures for one request. Times are seconds since the start of the
// run (one steady clock for every request), so records compare and sort without conversion.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace tandem::bench {

struct RequestRecord {
  double scheduled_s = 0;     // when the arrival schedule wanted it sent
  double send_s = 0;          // when the call was started (later than scheduled under
                              // --max-concurrency, or when the sender falls behind)
  double first_token_s = -1;  // first chunk carrying a token; -1 when none arrived
  double last_token_s = -1;   // last chunk carrying a token; -1 when none arrived
  double end_s = 0;           // when the call finished with its status
  // Inter-token latencies after the first chunk: a chunk of k tokens arriving g seconds after
  // the previous chunk adds k gaps of g/k. Tokens that share the first chunk add none (they
  // arrived with the first token, whose latency is the TTFT).
  std::vector<double> itl_s;
  int64_t streamed_tokens = 0;    // token ids received in chunks
  int64_t prompt_tokens = 0;      // Complete.usage.prompt_tokens
  int64_t completion_tokens = 0;  // Complete.usage.completion_tokens
  bool got_complete = false;      // a Complete message arrived
  // OK only when the stream ended OK after a Complete; a stream that ends OK without one is
  // recorded as INTERNAL so it is counted as a failure rather than a short success.
  absl::StatusCode code = absl::StatusCode::kUnknown;
  std::string error;  // the status message of a failed request

  bool ok() const { return code == absl::StatusCode::kOk; }
  double ttft_s() const { return first_token_s - send_s; }
  double e2e_s() const { return end_s - send_s; }
};

}  // namespace tandem::bench
