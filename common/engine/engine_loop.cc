#include "common/engine/engine_loop.h"

#include <time.h>

#include <chrono>
#include <optional>
#include <utility>

namespace tandem::engine {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// CPU seconds the calling thread has run.
double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

}  // namespace

EngineLoop::EngineLoop(std::unique_ptr<Engine> engine, ComputeShare* share, Phase phase)
    : engine_(std::move(engine)), share_(share), phase_(phase) {
  stats_.kv = engine_->KvStats();
  thread_ = std::thread([this] { Run(); });
}

EngineLoop::~EngineLoop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void EngineLoop::Submit(Request request, OutputFn on_output) {
  absl::MutexLock lock(&mu_);
  inbox_.push_back(
      {.kind = Command::kSubmit, .request = std::move(request), .on_output = std::move(on_output)});
  ++stats_.waiting;
}

void EngineLoop::Abort(const std::string& request_id) {
  Request r;
  r.id = request_id;
  absl::MutexLock lock(&mu_);
  inbox_.push_back({.kind = Command::kAbort, .request = std::move(r)});
}

void EngineLoop::Post(TaskFn task) {
  absl::MutexLock lock(&mu_);
  inbox_.push_back({.kind = Command::kTask, .task = std::move(task)});
}

absl::Status EngineLoop::RunOnTurn(const std::function<absl::Status()>& compute) {
  if (share_ == nullptr) return compute();
  ComputeShare::Turn turn = share_->Acquire(phase_);
  return compute();
}

EngineLoop::Stats EngineLoop::GetStats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void EngineLoop::Deliver(const RequestOutput& output) {
  auto it = callbacks_.find(output.id);
  if (it == callbacks_.end()) return;
  it->second(output, *engine_);
  if (output.finish != FinishReason::kNone) callbacks_.erase(it);
}

void EngineLoop::Apply(std::vector<Command>& commands) {
  for (Command& c : commands) {
    switch (c.kind) {
      case Command::kSubmit: {
        const std::string id = c.request.id;
        absl::Status s = callbacks_.contains(id)
                             ? absl::AlreadyExistsError("request id \"" + id + "\" is in use")
                             : engine_->AddRequest(std::move(c.request));
        if (s.ok()) {
          callbacks_[id] = std::move(c.on_output);
        } else {
          RequestOutput out;
          out.id = id;
          out.finish = FinishReason::kError;
          out.error = s;
          c.on_output(out, *engine_);
        }
        break;
      }
      case Command::kAbort:
        engine_->Abort(c.request.id);
        break;
      case Command::kTask:
        c.task(*engine_);
        break;
    }
  }
}

void EngineLoop::PublishStats(const LoopTime& time) {
  absl::MutexLock lock(&mu_);
  stats_.running = engine_->NumRunning();
  stats_.waiting = engine_->NumWaiting() + static_cast<int>(inbox_.size());
  stats_.kv = engine_->KvStats();
  stats_.time = time;
}

absl::StatusOr<std::vector<RequestOutput>> EngineLoop::StepOnTurn() {
  std::optional<ComputeShare::Turn> turn;
  if (share_ != nullptr) turn.emplace(share_->Acquire(phase_));
  const Clock::time_point start = Clock::now();
  const double cpu = ThreadCpuSeconds();
  absl::StatusOr<std::vector<RequestOutput>> outputs = engine_->Step();
  time_.step_cpu_seconds += ThreadCpuSeconds() - cpu;
  time_.step_seconds += Since(start);
  ++time_.steps;
  time_.step_sequences += engine_->LastBatchSize();
  return outputs;
}

void EngineLoop::Run() {
  std::vector<Command> commands;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      // Sleep only when the engine has nothing to do.
      auto ready = [this] {
        mu_.AssertHeld();  // Await evaluates it under mu_
        return stop_ || !inbox_.empty();
      };
      if (!engine_->HasUnfinished()) mu_.Await(absl::Condition(&ready));
      if (stop_) break;
      commands.swap(inbox_);
    }
    if (!commands.empty()) {
      const Clock::time_point start = Clock::now();
      Apply(commands);
      time_.task_seconds += Since(start);
      commands.clear();
    }
    std::vector<RequestOutput> outputs;
    absl::Status failure;
    if (engine_->HasUnfinished()) {
      absl::StatusOr<std::vector<RequestOutput>> stepped = StepOnTurn();
      if (stepped.ok()) {
        outputs = *std::move(stepped);
      } else {
        // A failed forward pass leaves no sequence trustworthy: end them all with the error.
        failure = stepped.status();
        for (auto& [id, fn] : callbacks_) engine_->Abort(id);
        (void)StepOnTurn();  // releases their blocks
      }
    }
    // Before the callbacks: whoever sees a finish sees its blocks released. The callbacks'
    // time is published with the next step's.
    PublishStats(time_);
    if (!outputs.empty()) {
      const Clock::time_point start = Clock::now();
      for (const RequestOutput& out : outputs) Deliver(out);
      time_.output_seconds += Since(start);
    }
    if (!failure.ok()) {
      for (auto& [id, fn] : callbacks_) {
        RequestOutput out;
        out.id = id;
        out.finish = FinishReason::kError;
        out.error = failure;
        fn(out, *engine_);
      }
      callbacks_.clear();
    }
  }
  // Shutdown. Queued tasks still run (another thread may be waiting on one); requests never
  // admitted end at once; those in flight are aborted.
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      commands.swap(inbox_);
    }
    if (commands.empty()) break;
    for (Command& c : commands) {
      if (c.kind == Command::kTask) c.task(*engine_);
      if (c.kind != Command::kSubmit) continue;
      RequestOutput out;
      out.id = c.request.id;
      out.finish = FinishReason::kAbort;
      c.on_output(out, *engine_);
    }
    commands.clear();
  }
  for (auto& [id, fn] : callbacks_) engine_->Abort(id);
  if (engine_->HasUnfinished()) {
    if (auto outputs = StepOnTurn(); outputs.ok()) {
      for (const RequestOutput& out : *outputs) Deliver(out);
    }
  }
  for (auto& [id, fn] : callbacks_) {
    RequestOutput out;
    out.id = id;
    out.finish = FinishReason::kAbort;
    fn(out, *engine_);
  }
  callbacks_.clear();
}

}  // namespace tandem::engine
