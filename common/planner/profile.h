#pragma once

// An engine profile: what one replica of the engine costs on one machine, measured by
// `engine-bench --profile-out` and read by the planner's simulator (docs/planner.md gives the
// file format). The file holds the measured samples, not fitted constants, so a later model of
// the engine can refit the same measurements.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::planner {

// One timed engine step.
//   prefill  `tokens` new prompt tokens of one sequence, after `context` tokens already in its
//            KV cache (a chunk of a chunked prefill); seconds include sampling the first token
//            when the chunk is the prompt's last.
//   decode   a step of `tokens` sequences (the batch) holding `context` cached tokens in all.
struct StepSample {
  int64_t tokens = 0;
  int64_t context = 0;
  double seconds = 0;
};

// One transfer of `bytes` of KV blocks through the store on one transport: a put (prefill to
// store) or a get (store to decode), which kv-handoff-bench measures at about the same rate.
struct TransferSample {
  std::string transport;  // "grpc", "shm" or "ucx" (the KV fabric over TCP)
  int64_t bytes = 0;
  double seconds = 0;
};

struct EngineProfile {
  static constexpr int kVersion = 1;
  // Where it was measured: free text for people (the CPU's name, thread count, date).
  std::string machine;
  std::string created;
  int threads = 0;
  // What was measured.
  std::string model;    // the model directory's name
  std::string weights;  // the weight format, as model-inspect prints it
  std::string cpu_gemm;
  std::string kv_dtype;
  int64_t parameters = 0;
  int num_layers = 0;
  int pop_start_layer = 0;  // num_layers: prefill-only pruning off
  int64_t kv_bytes_per_token = 0;
  int block_size = 0;
  std::vector<StepSample> prefill;
  std::vector<StepSample> decode;
  std::vector<TransferSample> transfer;
  // A worker's own time on its core beyond the engine's step, per message a step streams (per
  // token at scheduler.stream_interval 1: the output callback and the gRPC write), which
  // engine-bench cannot see: measured from a real run's CPU time
  // (bench/serving/validate_planner.py --calibrate); 0 when not.
  double token_overhead_seconds = 0;
  // The CPU time per streamed message of the processes pinned to no replica's core but sharing
  // the replicas' machine (the router relaying it, the client reading it, the store shard): the
  // simulator runs it on an idle replica's core, or takes it from the busy ones. Measured like
  // token_overhead_seconds; 0 where they run on machines of their own.
  double shared_overhead_seconds = 0;
  // Theirs per replica step that streams at least one message, beside the per-message part: a
  // step's messages reach them together (one wake-up, one read), so their cost per message
  // falls as batches grow.
  double shared_step_overhead_seconds = 0;
  // A prefill worker's time on its core per prompt it hands off, beyond the engine's step and
  // the store's put as kv-handoff-bench measures it on an idle machine: the export, the upload
  // thread's copies and RPCs, and the answer to the router, all on the worker's one core.
  // Calibrated like token_overhead_seconds (TTFT of a disaggregated run); 0 when not.
  double handoff_overhead_seconds = 0;
  // A decode worker's time on its core per prompt it imports, beyond the get of kv_transfer:
  // the blocks' Acquire, the copy out of the store's arena with its checksum, the Release.
  // Calibrated from a disaggregated run's TPOT p50; 0 when not.
  double import_overhead_seconds = 0;

  std::string ToJson() const;
  // InvalidArgument naming `source` and the offending field on anything malformed or out of
  // range; every list has a size limit.
  static absl::StatusOr<EngineProfile> FromJson(std::string_view text, std::string_view source);
};

// A phase's step time as the profile measured it: seconds = base(tokens) + per_work * work,
// where work is the attention's key reads (decode: the batch's cached tokens; prefill: a
// chunk's tokens times the keys each reads, AttentionWork). base is piecewise linear in tokens
// through each measured token count's intercept; per_work is one slope fitted within the
// groups of equal token count (least squares with an intercept per group), at least 0.
class StepModel {
 public:
  static absl::StatusOr<StepModel> Fit(const std::vector<StepSample>& samples, bool prefill,
                                       std::string_view what);
  double Seconds(int64_t tokens, double work) const;
  double per_work() const { return per_work_; }

  // Keys read by a prefill chunk of `tokens` after `context` cached ones (causal).
  static double PrefillWork(int64_t tokens, int64_t context) {
    return static_cast<double>(tokens) * (static_cast<double>(context) + (tokens + 1) / 2.0);
  }

 private:
  std::vector<int64_t> tokens_;  // ascending, distinct
  std::vector<double> base_;     // seconds at work 0, per entry of tokens_
  double per_work_ = 0;
};

// Seconds to hand `bytes` off through one transport: piecewise linear through the profile's
// samples for it, at the largest sample's rate beyond it. Fitted once, read per handoff.
class TransferModel {
 public:
  // NotFound when the profile has no sample for `transport`.
  static absl::StatusOr<TransferModel> Fit(const EngineProfile& profile,
                                           std::string_view transport);
  double Seconds(int64_t bytes) const;

 private:
  std::vector<int64_t> bytes_;  // ascending, distinct
  std::vector<double> seconds_;
};

// TransferModel::Fit(profile, transport), then Seconds(bytes).
absl::StatusOr<double> TransferSeconds(const EngineProfile& profile, std::string_view transport,
                                       int64_t bytes);

// The kv_transfer samples a disaggregated deployment's handoff is planned on, for its
// cache_store.transport (`auto`, `grpc`, `shm`, `ucx`) and cache_store.shared_memory: "ucx" for
// the fabric, "shm" where the workers map the shards' arenas (auto plans the node-local path),
// "grpc" otherwise. A profile without ucx samples (kv-handoff-bench --profile measures them)
// plans the fabric on the stream's; `fell_back`, if given, says so.
std::string PlannedTransport(const EngineProfile& profile, std::string_view transport,
                             bool shared_memory, bool* fell_back = nullptr);

}  // namespace tandem::planner
