#include "common/rpc/worker_agent.h"

#include <utility>

#include "absl/time/time.h"

namespace tandem::rpc {

WorkerAgent::WorkerAgent(engine::EngineLoop& loop, const WorkerCounters& counters,
                         const metrics::RoleMetrics& metrics, WorkerAgentOptions options)
    : loop_(loop), counters_(counters), metrics_(metrics), load_(loop) {
  publisher_ = std::thread([this] { PublishMetrics(); });
  if (!options.router.empty()) {
    registration_ = std::make_unique<WorkerRegistration>(
        options.router, std::move(options.registration),
        [this](tandem::v1::WorkerLoad* load, bool full) { FillLoad(load, full); },
        std::move(options.on_accepted),
        options.transport->ChannelCredentials(security::Role::kRouter));
  }
}

WorkerAgent::~WorkerAgent() {
  registration_.reset();
  stop_.Notify();
  publisher_.join();
}

void WorkerAgent::PublishMetrics() {
  int64_t worker_hits = 0, memory_hits = 0, disk_hits = 0, misses = 0, bytes = 0, requantized = 0;
  engine::EngineLoop::LoopTime was;
  auto advance = [](prometheus::Counter* c, double now, double before) {
    c->Increment(now - before);
  };
  do {
    const int64_t now_bytes = counters_.kv_bytes();
    metrics_.kv_transfer_bytes->Increment(static_cast<double>(now_bytes - bytes));
    bytes = now_bytes;
    const engine::EngineLoop::Stats s = loop_.GetStats();
    metrics_.requests_running->Set(s.running);
    metrics_.requests_waiting->Set(s.waiting);
    if (s.kv.total_blocks > 0) {
      metrics_.kv_cache_usage->Set(static_cast<double>(s.kv.used_blocks) / s.kv.total_blocks);
    }
    metrics_.kv_requantized_blocks->Increment(static_cast<double>(s.kv.narrowed - requantized));
    requantized = s.kv.narrowed;
    const engine::EngineLoop::LoopTime& t = s.time;
    advance(metrics_.engine_steps, static_cast<double>(t.steps), static_cast<double>(was.steps));
    advance(metrics_.engine_step_sequences, static_cast<double>(t.step_sequences),
            static_cast<double>(was.step_sequences));
    advance(metrics_.engine_step_seconds, t.step_seconds, was.step_seconds);
    advance(metrics_.engine_task_seconds, t.task_seconds, was.task_seconds);
    advance(metrics_.engine_output_seconds, t.output_seconds, was.output_seconds);
    advance(metrics_.engine_step_cpu_seconds, t.step_cpu_seconds, was.step_cpu_seconds);
    was = t;
    if (counters_.counts_lookups()) {
      auto advance_to = [](prometheus::Counter* c, int64_t now, int64_t& before) {
        c->Increment(static_cast<double>(now - before));
        before = now;
      };
      advance_to(metrics_.kv_lookup_hits, counters_.kv_worker_hits(), worker_hits);
      advance_to(metrics_.kv_lookup_memory_hits, counters_.kv_store_memory_hits(), memory_hits);
      advance_to(metrics_.kv_lookup_disk_hits, counters_.kv_store_disk_hits(), disk_hits);
      advance_to(metrics_.kv_lookup_misses, counters_.kv_misses(), misses);
    }
  } while (!stop_.WaitForNotificationWithTimeout(absl::Milliseconds(500)));
}

void WorkerAgent::FillLoad(tandem::v1::WorkerLoad* load, bool full) {
  load_.Fill(load, full);
  if (counters_.counts_lookups()) {
    load->set_kv_hits(counters_.kv_hits());
    load->set_kv_misses(counters_.kv_misses());
  }
}

}  // namespace tandem::rpc
