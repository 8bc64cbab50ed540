// A fake tandem.v1.Inference server for load-generator tests: streams `max_tokens` tokens in
// chunks of `chunk_tokens`, then a Complete with usage; can fail every n-th call and can hold
// streams until enough are active at once (to prove concurrency, or its limit).
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "tandem/v1/inference.grpc.pb.h"

namespace tandem::bench::testing {

struct FakeInferenceOptions {
  std::string model_name = "fake-model";
  int32_t vocab_size = 4096;
  int32_t context_length = 2048;
  int chunk_tokens = 1;
  int fail_every = 0;  // > 0: every n-th call (by arrival) ends RESOURCE_EXHAUSTED at once
  // > 0: a stream sends nothing while fewer than this many are active, unless
  // `release_at_calls` (> 0) calls have arrived. Held streams end only by cancellation.
  int release_at_active = 0;
  int release_at_calls = 0;
};

class FakeStream;

class FakeInference final : public tandem::v1::Inference::CallbackService {
 public:
  explicit FakeInference(FakeInferenceOptions options = {}) : options_(std::move(options)) {}

  grpc::ServerWriteReactor<tandem::v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context, const tandem::v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* context,
                                         const tandem::v1::GetModelInfoRequest* request,
                                         tandem::v1::ModelInfo* response) override;

  int64_t calls() const;
  int64_t peak_active() const;
  // Every request received, in arrival order.
  std::vector<tandem::v1::GenerateRequest> requests() const;

 private:
  friend class FakeStream;
  // Registers a new stream; true when it must wait for Release.
  bool Arrive(FakeStream* stream, const tandem::v1::GenerateRequest& request, bool* fail);
  // Removes `stream` from the held list; true when it was there.
  bool Unlist(FakeStream* stream);
  void Leave();

  const FakeInferenceOptions options_;
  mutable absl::Mutex mu_;
  int64_t calls_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t active_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t peak_active_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<FakeStream*> held_ ABSL_GUARDED_BY(mu_);
  std::vector<tandem::v1::GenerateRequest> requests_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::bench::testing
