// The router's view of one pool of workers (prefill or decode): their stubs, the load the
// router itself has put on them, which prefix blocks each probably holds, and which are out of
// rotation after failing.
//
// The prefix index is learnt from routing: blocks of a prompt sent to a worker are resident
// there afterwards (its local prefix cache) until evicted. Each worker's index is an LRU of
// block hashes bounded by `index_capacity`, so it forgets roughly as the worker evicts.
//
// Thread-safe.
#pragma once

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/security/transport.h"
#include "tandem/v1/workers.grpc.pb.h"

namespace tandem::router {

using Clock = std::chrono::steady_clock;

struct Worker {
  std::string address;
  std::unique_ptr<tandem::v1::PrefillWorker::Stub> prefill;
  std::unique_ptr<tandem::v1::DecodeWorker::Stub> decode;
};

struct WorkerPoolOptions {
  int block_size = 16;
  size_t index_capacity = 1 << 16;                  // block hashes per worker
  std::chrono::milliseconds failure_backoff{2000};  // out of rotation after a failure
  // HTTP/2 ping period on each worker's channel while calls are in flight; a worker that does
  // not answer within the same time (hung, stopped, its host gone) has its connection closed,
  // so its calls fail and are retried or migrated. Zero: no pings.
  std::chrono::milliseconds keepalive{10000};
  // A worker out of rotation for good (removed, or expired after missing heartbeats) for this
  // long is forgotten: its channel and state are freed, so pods that restart under new
  // addresses do not grow the router forever. It is kept while calls to it are in flight.
  std::chrono::milliseconds forget_after{std::chrono::minutes(10)};
  // How workers are reached; with TLS, a worker's certificate must name the pool's role.
  std::shared_ptr<const security::Transport> transport = security::Transport::Insecure();
};

// What the router answers a heartbeat.
struct HeartbeatResult {
  bool known = false;   // false: register again
  bool resync = false;  // KV events are missing: send a full snapshot next
};

class WorkerPool {
 public:
  WorkerPool(std::string role, const WorkerPoolOptions& options)
      : role_(std::move(role)), options_(options) {}

  // Adds a worker (no-op when the address is known).
  void Add(const std::string& address);
  void Remove(const std::string& address);
  int size() const;
  // Workers in rotation (not removed, expired or backing off after a failure).
  int available() const;

  // Registry: a worker that registers is added (or returned to rotation, cold) and gets an id;
  // its heartbeats report load and its prefix index as KV events (see workers.proto): the pool
  // applies the events after the last one it has, and asks for a resync when some are missing.
  std::string Register(const std::string& address);
  HeartbeatResult Heartbeat(const std::string& worker_id, const tandem::v1::WorkerLoad& load);
  // Takes registered workers silent for longer than `max_silence` out of rotation (until they
  // register again); returns their addresses.
  std::vector<std::string> ExpireSilent(Clock::duration max_silence);
  // Frees the workers out of rotation for good for longer than `forget_after` with no call in
  // flight; returns their addresses.
  std::vector<std::string> ForgetGone();
  // The prefix blocks the pool believes `address` holds (tests, diagnostics).
  std::vector<uint64_t> KnownBlocks(const std::string& address) const;

  // Prefill choice: fewest uncached prefix blocks plus queued tokens in blocks, ties by load.
  // Decode choice: most resident prefix blocks, then least load. Workers that failed recently
  // are skipped, and so are those in `exclude`, unless nothing else is left; null when empty.
  Worker* PickPrefill(std::span<const uint64_t> hashes, const std::vector<Worker*>& exclude);
  Worker* PickDecode(std::span<const uint64_t> hashes, const std::vector<Worker*>& exclude);

  // Load the router placed on `worker`: a request of `tokens` tokens whose prompt blocks are
  // `hashes`. With `uncached_only` (prefill) the work counted is the tokens past the prefix the
  // worker is believed to hold, since it computes only those. Returns the tokens counted, for
  // End.
  int64_t Begin(Worker* worker, int64_t tokens, std::span<const uint64_t> hashes,
                bool uncached_only = false);
  void End(Worker* worker, int64_t tokens);
  // Takes the worker out of rotation for the backoff period.
  void MarkFailed(Worker* worker);

 private:
  struct State {
    std::unique_ptr<Worker> worker;
    std::string id;  // registry id; empty for statically configured workers
    Clock::time_point last_heartbeat{};
    int64_t inflight_requests = 0;  // what this router sent
    int64_t inflight_tokens = 0;
    int64_t reported_requests = 0;  // what the worker last reported (every router's share)
    int64_t reported_tokens = 0;
    Clock::time_point failed_until{};  // max: out of rotation for good
    Clock::time_point gone_since{};    // when failed_until became max
    // KV events: the next sequence number expected, once a full snapshot has been applied.
    uint64_t next_event_seq = 0;
    bool synced = false;
    // LRU of resident block hashes: front = most recent.
    std::list<uint64_t> lru;
    absl::flat_hash_map<uint64_t, std::list<uint64_t>::iterator> index;
  };
  State* Find(Worker* worker) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  State* FindAddress(const std::string& address) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  State* AddLocked(const std::string& address) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static void Retire(State& s);  // out of rotation for good, its index dropped
  static void ClearIndex(State& s);
  static void Remember(State& s, uint64_t hash, size_t capacity);
  static void Forget(State& s, uint64_t hash);
  static int64_t Requests(const State& s) {
    return std::max(s.inflight_requests, s.reported_requests);
  }
  static int64_t Tokens(const State& s) { return std::max(s.inflight_tokens, s.reported_tokens); }
  // Leading blocks of `hashes` the worker holds.
  static int64_t Matched(const State& s, std::span<const uint64_t> hashes);
  template <typename Score>
  Worker* Pick(const std::vector<Worker*>& exclude, Score score);

  const std::string role_;
  const WorkerPoolOptions options_;
  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<State>> workers_ ABSL_GUARDED_BY(mu_);
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace tandem::router
