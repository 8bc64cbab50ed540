#include "router/worker_pool.h"

#include <algorithm>
#include <limits>
#include <tuple>

namespace tandem::router {

void WorkerPool::Add(const std::string& address) {
  absl::MutexLock lock(&mu_);
  for (const auto& s : workers_) {
    if (s->worker->address == address) return;
  }
  auto state = std::make_unique<State>();
  state->worker = std::make_unique<Worker>();
  state->worker->address = address;
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  state->worker->prefill = tandem::v1::PrefillWorker::NewStub(channel);
  state->worker->decode = tandem::v1::DecodeWorker::NewStub(channel);
  workers_.push_back(std::move(state));
}

void WorkerPool::Remove(const std::string& address) {
  // Workers are never freed while the router runs (calls in flight hold Worker*); a removed
  // worker is parked out of rotation for good instead.
  absl::MutexLock lock(&mu_);
  for (const auto& s : workers_) {
    if (s->worker->address == address) s->failed_until = Clock::time_point::max();
  }
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
    const bool excluded = std::find(exclude.begin(), exclude.end(), s.worker.get()) != exclude.end();
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
    return std::make_pair(uncached + s.inflight_tokens / bs, s.inflight_requests);
  });
}

Worker* WorkerPool::PickDecode(std::span<const uint64_t> hashes,
                               const std::vector<Worker*>& exclude) {
  return Pick(exclude, [&](const State& s) {
    return std::make_pair(-Matched(s, hashes), s.inflight_requests * 1'000'000 + s.inflight_tokens);
  });
}

WorkerPool::State* WorkerPool::Find(Worker* worker) {
  for (const auto& s : workers_) {
    if (s->worker.get() == worker) return s.get();
  }
  return nullptr;
}

void WorkerPool::Begin(Worker* worker, int64_t tokens, std::span<const uint64_t> hashes) {
  absl::MutexLock lock(&mu_);
  State* s = Find(worker);
  if (s == nullptr) return;
  ++s->inflight_requests;
  s->inflight_tokens += tokens;
  for (uint64_t h : hashes) {
    auto it = s->index.find(h);
    if (it != s->index.end()) {
      s->lru.splice(s->lru.begin(), s->lru, it->second);
      continue;
    }
    s->lru.push_front(h);
    s->index[h] = s->lru.begin();
    if (s->lru.size() > options_.index_capacity) {
      s->index.erase(s->lru.back());
      s->lru.pop_back();
    }
  }
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
    s->lru.clear();  // a restarted worker starts cold
    s->index.clear();
  }
}

}  // namespace tandem::router
