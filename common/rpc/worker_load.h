// What a worker's heartbeats tell the router (workers.proto, WorkerLoad): its engine's occupancy
// and its prefix index, as the KV events since the last heartbeat or, when asked (after
// registering, a failed heartbeat, a router's resync) or when the log no longer reaches back, a
// full snapshot. The router applies them to its view of the worker (router/worker_pool.h).
//
// Threads: Fill runs on the registration thread; it reads the KV cache through a task on the
// engine loop, the cache's only thread.
#pragma once

#include <chrono>
#include <cstdint>

#include "common/engine/engine_loop.h"
#include "tandem/v1/workers.pb.h"

namespace tandem::rpc {

class WorkerLoadReporter {
 public:
  // `loop` must outlive the reporter. A loop busier than `timeout` gets its index reported next
  // time.
  explicit WorkerLoadReporter(engine::EngineLoop& loop,
                              std::chrono::milliseconds timeout = std::chrono::seconds(1))
      : loop_(loop), timeout_(timeout) {}

  // Fills running, waiting, kv_usage and the prefix index (events, or a snapshot with `full`).
  void Fill(tandem::v1::WorkerLoad* load, bool full);

 private:
  engine::EngineLoop& loop_;
  const std::chrono::milliseconds timeout_;
  uint64_t next_seq_ = 0;  // the first event not yet sent
};

}  // namespace tandem::rpc
