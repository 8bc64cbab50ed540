#include "router/worker_pool.h"

#include <algorithm>
#include <limits>
#include <tuple>

#include "absl/strings/str_cat.h"

namespace tandem::router {

WorkerPool::State* WorkerPool::FindAddress(const std::string& address) {
  for (const auto& s : workers_) {
    if (s->worker->address == address) return s.get();
  }
  return nullptr;
}

void WorkerPool::Add(const std::string& address) {
  absl::MutexLock lock(&mu_);
  AddLocked(address);
}

WorkerPool::State* WorkerPool::AddLocked(const std::string& address) {
  if (State* known = FindAddress(address)) return known;
  auto state = std::make_unique<State>();
  state->worker = std::make_unique<Worker>();
  state->worker->address = address;
  grpc::ChannelArguments args;
  if (options_.keepalive.count() > 0) {
    const int ms = static_cast<int>(options_.keepalive.count());
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, ms);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, ms);
    args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);  // a long prefill sends no data
  }
  const security::Role role =
      role_ == "prefill" ? security::Role::kPrefill : security::Role::kDecode;
  auto channel =
      grpc::CreateCustomChannel(address, options_.transport->ChannelCredentials(role), args);
  state->worker->prefill = tandem::v1::PrefillWorker::NewStub(channel);
  state->worker->decode = tandem::v1::DecodeWorker::NewStub(channel);
  workers_.push_back(std::move(state));
  return workers_.back().get();
}

void WorkerPool::Remove(const std::string& address) {
  // Workers are never freed while the router runs (calls in flight hold Worker*); a removed
  // worker is parked out of rotation for good instead.
  absl::MutexLock lock(&mu_);
  for (const auto& s : workers_) {
    if (s->worker->address == address && s->failed_until != Clock::time_point::max()) Retire(*s);
  }
}

void WorkerPool::Retire(State& s) {
  s.failed_until = Clock::time_point::max();
  s.gone_since = Clock::now();
  s.id.clear();
  ClearIndex(s);
}

void WorkerPool::ClearIndex(State& s) {
  s.lru.clear();
  s.index.clear();
  s.synced = false;
}

std::string WorkerPool::Register(const std::string& address) {
  absl::MutexLock lock(&mu_);
  State* s = AddLocked(address);
  s->id = absl::StrCat(role_, "-", next_id_++);
  s->last_heartbeat = Clock::now();
  s->failed_until = {};  // back in rotation, cold: it may have restarted
  ClearIndex(*s);
  return s->id;
}

HeartbeatResult WorkerPool::Heartbeat(const std::string& worker_id,
                                      const tandem::v1::WorkerLoad& load) {
  absl::MutexLock lock(&mu_);
  State* s = nullptr;
  for (const auto& w : workers_) {
    if (!worker_id.empty() && w->id == worker_id) s = w.get();
  }
  if (s == nullptr || s->failed_until == Clock::time_point::max()) return {};
  s->last_heartbeat = Clock::now();
  s->reported_requests = load.running() + load.waiting();
  s->reported_tokens = load.queued_tokens();
  const uint64_t first = load.kv_events_first_seq();
  if (load.full_block_snapshot()) {
    ClearIndex(*s);
    for (uint64_t h : load.new_block_hashes()) Remember(*s, h, options_.index_capacity);
    s->next_event_seq = first;
    s->synced = true;
  } else if (!s->synced || first > s->next_event_seq) {
    ClearIndex(*s);  // what it knew is stale by an unknown amount
    return {.known = true, .resync = true};
  }
  // Events before next_event_seq were applied already (a heartbeat sent twice).
  const auto& events = load.kv_events();
  for (int i = 0; i < events.size(); ++i) {
    if (first + i < s->next_event_seq) continue;
    if (events[i].removed()) {
      Forget(*s, events[i].block_hash());
    } else {
      Remember(*s, events[i].block_hash(), options_.index_capacity);
    }
  }
  s->next_event_seq = std::max(s->next_event_seq, first + events.size());
  return {.known = true};
}

std::vector<std::string> WorkerPool::ExpireSilent(Clock::duration max_silence) {
  absl::MutexLock lock(&mu_);
  const Clock::time_point now = Clock::now();
  std::vector<std::string> expired;
  for (const auto& s : workers_) {
    if (s->id.empty() || s->failed_until == Clock::time_point::max()) continue;
    if (now - s->last_heartbeat > max_silence) {
      Retire(*s);
      expired.push_back(s->worker->address);
    }
  }
  return expired;
}

std::vector<std::string> WorkerPool::ForgetGone() {
  absl::MutexLock lock(&mu_);
  const Clock::time_point now = Clock::now();
  std::vector<std::string> forgotten;
  std::erase_if(workers_, [&](const std::unique_ptr<State>& s) {
    const bool gone = s->failed_until == Clock::time_point::max() &&
                      now - s->gone_since >= options_.forget_after && s->inflight_requests == 0;
    if (gone) forgotten.push_back(s->worker->address);
    return gone;
  });
  return forgotten;
}

std::vector<uint64_t> WorkerPool::KnownBlocks(const std::string& address) const {
  absl::MutexLock lock(&mu_);
  for (const auto& s : workers_) {
    if (s->worker->address == address) return {s->lru.begin(), s->lru.end()};
  }
  return {};
}

int WorkerPool::available() const {
  absl::MutexLock lock(&mu_);
  const Clock::time_point now = Clock::now();
  return static_cast<int>(std::count_if(workers_.begin(), workers_.end(),
                                        [&](const auto& s) { return s->failed_until <= now; }));
}

int WorkerPool::size() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(workers_.size());
}

int64_t WorkerPool::Matched(const State& s, std::span<const uint64_t> hashes) {
  int64_t n = 0;
  while (n < static_cast<int64_t>(hashes.size()) && s.index.contains(hashes[n])) ++n;
  return n;
}

template <typename Score>
Worker* WorkerPool::Pick(const std::vector<Worker*>& exclude, Score score) {
  absl::MutexLock lock(&mu_);
  const Clock::time_point now = Clock::now();
  State* best = nullptr;
  // Rank: usable first (not excluded, not backing off), then the score (lower is better).
  auto key = [&](const State& s) {
    const bool excluded =
        std::find(exclude.begin(), exclude.end(), s.worker.get()) != exclude.end();
    const bool failing = s.failed_until > now;
    return std::make_tuple(excluded || failing, s.failed_until == Clock::time_point::max(),
                           score(s));
  };
  for (const auto& s : workers_) {
    if (best == nullptr || key(*s) < key(*best)) best = s.get();
  }
  if (best == nullptr || best->failed_until == Clock::time_point::max()) return nullptr;
  return best->worker.get();
}

Worker* WorkerPool::PickPrefill(std::span<const uint64_t> hashes,
                                const std::vector<Worker*>& exclude) {
  const int64_t bs = options_.block_size;
  return Pick(exclude, [&](const State& s) {
    const int64_t uncached = static_cast<int64_t>(hashes.size()) - Matched(s, hashes);
    return std::make_pair(uncached + Tokens(s) / bs, Requests(s));
  });
}

Worker* WorkerPool::PickDecode(std::span<const uint64_t> hashes,
                               const std::vector<Worker*>& exclude) {
  return Pick(exclude, [&](const State& s) {
    return std::make_tuple(-Matched(s, hashes), Requests(s), Tokens(s));
  });
}

WorkerPool::State* WorkerPool::Find(Worker* worker) {
  for (const auto& s : workers_) {
    if (s->worker.get() == worker) return s.get();
  }
  return nullptr;
}

int64_t WorkerPool::Begin(Worker* worker, int64_t tokens, std::span<const uint64_t> hashes,
                          bool uncached_only) {
  absl::MutexLock lock(&mu_);
  State* s = Find(worker);
  if (s == nullptr) return 0;
  if (uncached_only) tokens = std::max<int64_t>(0, tokens - Matched(*s, hashes) * options_.block_size);
  ++s->inflight_requests;
  s->inflight_tokens += tokens;
  for (uint64_t h : hashes) Remember(*s, h, options_.index_capacity);
  return tokens;
}

void WorkerPool::Remember(State& s, uint64_t hash, size_t capacity) {
  auto it = s.index.find(hash);
  if (it != s.index.end()) {
    s.lru.splice(s.lru.begin(), s.lru, it->second);
    return;
  }
  s.lru.push_front(hash);
  s.index[hash] = s.lru.begin();
  if (s.lru.size() > capacity) {
    s.index.erase(s.lru.back());
    s.lru.pop_back();
  }
}

void WorkerPool::Forget(State& s, uint64_t hash) {
  auto it = s.index.find(hash);
  if (it == s.index.end()) return;
  s.lru.erase(it->second);
  s.index.erase(it);
}

void WorkerPool::End(Worker* worker, int64_t tokens) {
  absl::MutexLock lock(&mu_);
  State* s = Find(worker);
  if (s == nullptr) return;
  --s->inflight_requests;
  s->inflight_tokens -= tokens;
}

void WorkerPool::MarkFailed(Worker* worker) {
  absl::MutexLock lock(&mu_);
  State* s = Find(worker);
  if (s != nullptr && s->failed_until != Clock::time_point::max()) {
    s->failed_until = Clock::now() + options_.failure_backoff;
    ClearIndex(*s);  // a restarted worker starts cold
  }
}

}  // namespace tandem::router
