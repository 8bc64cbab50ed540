// One streaming Generate call of the load generator, on gRPC's callback API: no thread per
// call, so hundreds of streams cost hundreds of small objects, not hundreds of stacks.
#pragma once

#include <chrono>
#include <functional>

#include "bench/serving/dataset.h"
#include "bench/serving/request_record.h"
#include "tandem/v1/inference.grpc.pb.h"

namespace tandem::bench {

// The run's time origin; every timestamp in a RequestRecord is seconds since `start`.
struct RunClock {
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  double Now() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
};

// Fills one RequestRecord as the stream arrives. Reactions run on gRPC's threads, one at a time
// for a given call (one read is outstanding at a time); the record is written only by them
// until `on_done` runs. The call deletes itself when it ends, then calls `on_done(ok)` last, so
// whoever waits on `on_done` may destroy the stub and the clock.
class GenerateCall final : public grpc::ClientReadReactor<tandem::v1::GenerateResponse> {
 public:
  // Sends `request` with ignore_eos and a deadline `timeout` from now; sets `record.send_s`.
  static void Start(tandem::v1::Inference::Stub& stub, const BenchRequest& request,
                    std::chrono::duration<double> timeout, const RunClock& clock,
                    RequestRecord& record, std::function<void(bool ok)> on_done,
                    const std::string& authorization = "");

  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

 private:
  GenerateCall(const RunClock& clock, RequestRecord& record, std::function<void(bool)> on_done)
      : clock_(clock), record_(record), on_done_(std::move(on_done)) {}
  void OnChunk(const tandem::v1::Chunk& chunk);

  const RunClock& clock_;
  RequestRecord& record_;
  std::function<void(bool)> on_done_;
  grpc::ClientContext context_;
  tandem::v1::GenerateRequest request_;
  tandem::v1::GenerateResponse response_;
};

}  // namespace tandem::bench
