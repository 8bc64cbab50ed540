#include "common/rpc/worker_load.h"

#include <memory>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/kv/kv_events.h"

namespace tandem::rpc {

void WorkerLoadReporter::Fill(tandem::v1::WorkerLoad* load, bool full) {
  const engine::EngineLoop::Stats s = loop_.GetStats();
  load->set_running(s.running);
  load->set_waiting(s.waiting);
  if (s.kv.total_blocks > 0) {
    load->set_kv_usage(static_cast<double>(s.kv.used_blocks) / s.kv.total_blocks);
  }
  // Shared with the loop's task, which may outlive a wait that timed out.
  struct Read {
    absl::Notification done;
    bool full = false;
    uint64_t first_seq = 0;
    std::vector<kv::KvEvent> events;
    std::vector<kv::BlockHash> snapshot;
  };
  auto read = std::make_shared<Read>();
  read->full = full;
  read->first_seq = next_seq_;
  loop_.Post([read](engine::Engine& e) {
    const kv::KvCacheManager& kv = e.kv_cache();
    if (!read->full && !kv.events().Since(read->first_seq, &read->events)) read->full = true;
    if (read->full) {
      read->snapshot = kv.IndexedHashes();
      read->first_seq = kv.events().next_seq();
    }
    read->done.Notify();
  });
  load->set_kv_events_first_seq(next_seq_);
  if (!read->done.WaitForNotificationWithTimeout(absl::FromChrono(timeout_))) {
    return;  // busy: no events this time (a router waiting for a snapshot asks again)
  }
  load->set_full_block_snapshot(read->full);
  load->set_kv_events_first_seq(read->first_seq);
  for (kv::BlockHash h : read->snapshot) load->add_new_block_hashes(h);
  for (const kv::KvEvent& e : read->events) {
    tandem::v1::KvEvent* out = load->add_kv_events();
    out->set_block_hash(e.hash);
    out->set_removed(e.removed);
  }
  next_seq_ = read->first_seq + read->events.size();
}

}  // namespace tandem::rpc
