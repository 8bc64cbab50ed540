#include "common/kv/kv_events.h"

namespace tandem::kv {

void KvEventLog::Append(BlockHash hash, bool removed) {
  events_.push_back({next_seq_++, hash, removed});
  while (events_.size() > capacity_) events_.pop_front();
}

bool KvEventLog::Since(uint64_t from, std::vector<KvEvent>* out) const {
  if (from >= next_seq_) return true;  // nothing new
  const uint64_t oldest = events_.empty() ? next_seq_ : events_.front().seq;
  if (from < oldest) return false;
  for (auto it = events_.begin() + static_cast<std::ptrdiff_t>(from - oldest); it != events_.end();
       ++it) {
    out->push_back(*it);
  }
  return true;
}

}  // namespace tandem::kv
