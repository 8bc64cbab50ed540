#include "cache_store/shm_leases.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace tandem::cache_store {

ShmLeases::ShmLeases(const ShmLeaseOptions& options)
    : options_(options), reaper_([this] { Reap(); }) {}

ShmLeases::~ShmLeases() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  reaper_.join();
  absl::MutexLock lock(&mu_);
  leases_.clear();  // unpins and abandons what is left
}

absl::StatusOr<uint64_t> ShmLeases::Add(Lease lease, std::string owner) {
  absl::MutexLock lock(&mu_);
  if (static_cast<int64_t>(leases_.size()) >= options_.max_leases) {
    return absl::ResourceExhaustedError(
        absl::StrCat("shared memory: ", leases_.size(), " leases open, the most a shard holds"));
  }
  uint64_t id = 0;
  while (id == 0 || leases_.contains(id)) id = absl::Uniform<uint64_t>(ids_);
  leases_.emplace(id, Held{std::move(lease), Clock::now() + options_.ttl, std::move(owner)});
  return id;
}

absl::StatusOr<ShmLeases::Lease> ShmLeases::Take(uint64_t id, Kind kind, const std::string& owner) {
  absl::MutexLock lock(&mu_);
  auto it = leases_.find(id);
  if (it == leases_.end()) {
    return absl::NotFoundError(absl::StrCat("shared memory: lease ", id, " expired or unknown"));
  }
  if (it->second.owner != owner) {
    return absl::PermissionDeniedError(
        absl::StrCat("shared memory: lease ", id, " belongs to another client connection"));
  }
  const bool write = !it->second.lease.puts.empty();
  if ((kind == Kind::kWrite && !write) || (kind == Kind::kRead && write)) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared memory: lease ", id, " is a ", write ? "write" : "read", " lease"));
  }
  Lease lease = std::move(it->second.lease);
  leases_.erase(it);
  return lease;
}

int64_t ShmLeases::open() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(leases_.size());
}

int64_t ShmLeases::expired() const {
  absl::MutexLock lock(&mu_);
  return expired_;
}

void ShmLeases::Reap() {
  absl::MutexLock lock(&mu_);
  while (true) {
    mu_.Await(absl::Condition(
        +[](ShmLeases* self) {
          self->mu_.AssertHeld();  // Await evaluates it under mu_
          return self->stopping_ || !self->leases_.empty();
        },
        this));
    if (stopping_) return;
    Clock::time_point earliest = Clock::time_point::max();
    for (const auto& [id, held] : leases_) earliest = std::min(earliest, held.deadline);
    const Clock::time_point now = Clock::now();
    if (now < earliest) {
      // Leases all live ttl, so none added meanwhile can end before `earliest`.
      mu_.AwaitWithTimeout(absl::Condition(&stopping_), absl::FromChrono(earliest - now));
      continue;
    }
    std::vector<Lease> ended;
    for (auto it = leases_.begin(); it != leases_.end();) {
      if (it->second.deadline <= now) {
        ended.push_back(std::move(it->second.lease));
        leases_.erase(it++);
      } else {
        ++it;
      }
    }
    expired_ += static_cast<int64_t>(ended.size());
    mu_.Unlock();  // ending a lease takes the store's lock
    ended.clear();
    mu_.Lock();
  }
}

}  // namespace tandem::cache_store
