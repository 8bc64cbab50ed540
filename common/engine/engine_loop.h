// Runs an Engine on its own thread: other threads (gRPC handlers) submit requests, aborts and
// tasks; the loop thread alone touches the engine, draining its inbox between steps and
// stepping while work remains. Outputs reach each request's callback on the loop thread.
//
// Threading: Submit, Abort, Post and Stats may be called from any thread. Callbacks and posted
// tasks run on the loop thread with the engine in hand, between steps — so a prefill worker can
// export a finished prompt's KV blocks before anything else allocates, and a decode worker can
// import blocks before the request that needs them is admitted. They must not block for long.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/engine/compute_share.h"
#include "common/engine/engine.h"

namespace tandem::engine {

class EngineLoop {
 public:
  // Called for every output of the request; the last one has finish != kNone. A request the
  // engine refuses gets one output with finish kError and the reason in `error`.
  using OutputFn = std::function<void(const RequestOutput& output, Engine& engine)>;
  using TaskFn = std::function<void(Engine& engine)>;

  // Where the loop thread's time went, summed since the loop started (wall seconds unless
  // said). Their sum against the elapsed time is how busy the engine is: near 1, requests queue
  // behind it. `step_cpu_seconds` below `step_seconds` is time the loop thread waited for a
  // core mid-step (other processes or threads on it); with model.threads > 1, the pool's other
  // threads' CPU is not in it.
  struct LoopTime {
    int64_t steps = 0;
    int64_t step_sequences = 0;  // the steps' batch sizes summed: / steps = mean batch
    double step_seconds = 0;     // forward passes and sampling, not the wait for a turn
    double step_cpu_seconds = 0;
    double task_seconds = 0;    // admissions, aborts and posted tasks (KV imports, exports)
    double output_seconds = 0;  // the requests' output callbacks
  };

  struct Stats {
    int running = 0;
    int waiting = 0;  // in the engine's queue or the inbox
    kv::KvCacheStats kv;
    LoopTime time;
  };

  // `share`: the process's shared compute, when the engine's model computes on share->pool();
  // each step then runs on a turn of `phase`. Null: the engine has its pool to itself.
  explicit EngineLoop(std::unique_ptr<Engine> engine, ComputeShare* share = nullptr,
                      Phase phase = Phase::kDecode);
  // Stops the thread; requests still in flight or queued end with finish kAbort, queued tasks
  // still run. Submit and Post after destruction has begun are not allowed.
  ~EngineLoop();
  EngineLoop(const EngineLoop&) = delete;
  EngineLoop& operator=(const EngineLoop&) = delete;

  void Submit(Request request, OutputFn on_output);
  void Abort(const std::string& request_id);
  void Post(TaskFn task);
  // For a task (on the loop thread) that computes outside a step, e.g. a forward pass: runs
  // `compute` on a turn of the shared pool, like a step (directly without one). A long task
  // calls it once per piece, so other engines step between the pieces.
  absl::Status RunOnTurn(const std::function<absl::Status()>& compute);
  Stats GetStats() const;

 private:
  struct Command {
    enum Kind { kSubmit, kAbort, kTask } kind;
    Request request{};  // kSubmit; request.id for kAbort
    OutputFn on_output = nullptr;
    TaskFn task = nullptr;
  };

  void Run();
  // Applies the inbox to the engine (loop thread only).
  void Apply(std::vector<Command>& commands);
  void Deliver(const RequestOutput& output);
  void PublishStats(const LoopTime& time);
  absl::StatusOr<std::vector<RequestOutput>> StepOnTurn();

  std::unique_ptr<Engine> engine_;  // loop thread only, after construction
  ComputeShare* const share_;
  const Phase phase_;
  absl::flat_hash_map<std::string, OutputFn> callbacks_;  // loop thread only

  mutable absl::Mutex mu_;
  std::vector<Command> inbox_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  Stats stats_ ABSL_GUARDED_BY(mu_);  // refreshed by the loop after every step
  LoopTime time_;                     // loop thread only; copied into stats_

  std::thread thread_;
};

}  // namespace tandem::engine
