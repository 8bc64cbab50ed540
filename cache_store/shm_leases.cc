#include "cache_store/shm_leases.h"

#include <sys/random.h>

#include <algorithm>
#include <cerrno>
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

namespace {

// 16 bytes from the kernel's CSPRNG (getrandom blocks only before it is seeded, at boot).
absl::StatusOr<ShmLeases::Key> NewKey() {
  ShmLeases::Key key{};
  auto* p = reinterpret_cast<char*>(key.data());
  size_t got = 0;
  while (got < sizeof key) {
    const ssize_t n = getrandom(p + got, sizeof key - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return absl::UnavailableError("lease key: getrandom failed");
    got += static_cast<size_t>(n);
  }
  return key;
}

bool SameKey(const ShmLeases::Key& a, const ShmLeases::Key& b) {
  uint64_t diff = 0;  // in constant time: no early exit on the first differing word
  for (size_t i = 0; i < a.size(); ++i) diff |= a[i] ^ b[i];
  return diff == 0;
}

}  // namespace

absl::StatusOr<ShmLeases::Added> ShmLeases::Add(Lease lease, std::string owner, bool keyed) {
  Key key{};
  if (keyed) {
    absl::StatusOr<Key> k = NewKey();
    if (!k.ok()) return k.status();
    key = *k;
  }
  absl::MutexLock lock(&mu_);
  if (static_cast<int64_t>(leases_.size()) >= options_.max_leases) {
    return absl::ResourceExhaustedError(
        absl::StrCat("shared memory: ", leases_.size(), " leases open, the most a shard holds"));
  }
  uint64_t id = 0;
  while (id == 0 || leases_.contains(id)) id = absl::Uniform<uint64_t>(ids_);
  leases_.emplace(id, Held{std::make_shared<Lease>(std::move(lease)), Clock::now() + options_.ttl,
                           std::move(owner), keyed, key});
  return Added{id, key};
}

absl::StatusOr<std::shared_ptr<ShmLeases::Lease>> ShmLeases::Take(uint64_t id, Kind kind,
                                                                  const std::string& owner) {
  absl::MutexLock lock(&mu_);
  auto it = leases_.find(id);
  if (it == leases_.end()) {
    return absl::NotFoundError(absl::StrCat("shared memory: lease ", id, " expired or unknown"));
  }
  if (it->second.owner != owner) {
    return absl::PermissionDeniedError(
        absl::StrCat("shared memory: lease ", id, " belongs to another client connection"));
  }
  const bool write = !it->second.lease->puts.empty();
  if ((kind == Kind::kWrite && !write) || (kind == Kind::kRead && write)) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared memory: lease ", id, " is a ", write ? "write" : "read", " lease"));
  }
  if (kind == Kind::kWrite && it->second.lease.use_count() > 1) {
    return absl::FailedPreconditionError(
        absl::StrCat("shared memory: lease ", id, " has a transfer in flight"));
  }
  std::shared_ptr<Lease> lease = std::move(it->second.lease);
  leases_.erase(it);
  return lease;
}

absl::StatusOr<std::shared_ptr<const ShmLeases::Lease>> ShmLeases::Borrow(uint64_t id,
                                                                          const Key& key,
                                                                          Kind kind) {
  absl::MutexLock lock(&mu_);
  auto it = leases_.find(id);
  if (it != leases_.end() && it->second.keyed && SameKey(it->second.key, key)) {
    const bool write = !it->second.lease->puts.empty();
    if ((kind == Kind::kWrite && write) || (kind == Kind::kRead && !write)) {
      return std::shared_ptr<const Lease>(it->second.lease);
    }
  }
  return absl::PermissionDeniedError(
      "fabric: no such lease, a wrong key, or a lease of the other kind");
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
    std::vector<std::shared_ptr<Lease>> ended;
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
