// ThreadSanitizer support for Debian's Abseil, which is built without TSan: its Mutex,
// CondVar and Notification synchronize through atomics and futexes TSan cannot see, so every
// access guarded by an absl::Mutex would look like a race. Linked into the test executables of
// a TANDEM_TSAN build only, this file interposes the library's entry points (the executable's
// definitions win over the shared library's), calls the real ones through dlsym(RTLD_NEXT),
// and tells TSan the happens-before edges they create: unlocking releases the mutex, locking
// acquires it, and waiting on a condition releases and then re-acquires it.
#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <cstdio>
#include <cstdlib>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace {

template <typename Fn>
Fn Real(const char* mangled) {
  void* f = dlsym(RTLD_NEXT, mangled);
  if (f == nullptr) {
    std::fprintf(stderr, "absl_sync_tsan: %s not found in Abseil\n", mangled);
    std::abort();
  }
  return reinterpret_cast<Fn>(f);
}

#define REAL(type, mangled) static const auto real = Real<type>("_ZN4absl7debian3" mangled)
#define REAL_CONST(type, mangled) static const auto real = Real<type>("_ZNK4absl7debian3" mangled)

// Abseil's deadlock detector keeps its lock graph under a spinlock of its own, invisible to
// TSan; the other builds keep it on (it catches a mutex locked twice by one thread).
const bool kNoDeadlockGraph = [] {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  return true;
}();

void Acquire(const void* p) { __tsan_acquire(const_cast<void*>(p)); }
void Release(const void* p) { __tsan_release(const_cast<void*>(p)); }

// A condition is evaluated under the mutex inside Abseil, before the call returns (by the
// waiter or by the thread unlocking): acquire first, so what it reads is ordered after the
// last holder's writes, and release after, so the next holder's writes are ordered after it.
struct Guarded {
  const void* mu;
  const absl::Condition* cond;
};
bool EvalAcquired(Guarded* g) {
  Acquire(g->mu);
  const bool met = g->cond->Eval();
  Release(g->mu);  // a waiter whose condition is false lets the mutex go after it
  return met;
}

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

void Mutex::Lock() {
  REAL(void (*)(Mutex*), "5Mutex4LockEv");
  real(this);
  Acquire(this);
}
void Mutex::Unlock() {
  REAL(void (*)(Mutex*), "5Mutex6UnlockEv");
  Release(this);
  real(this);
}
bool Mutex::TryLock() {
  REAL(bool (*)(Mutex*), "5Mutex7TryLockEv");
  const bool locked = real(this);
  if (locked) Acquire(this);
  return locked;
}
void Mutex::ReaderLock() {
  REAL(void (*)(Mutex*), "5Mutex10ReaderLockEv");
  real(this);
  Acquire(this);
}
void Mutex::ReaderUnlock() {
  REAL(void (*)(Mutex*), "5Mutex12ReaderUnlockEv");
  Release(this);
  real(this);
}
bool Mutex::ReaderTryLock() {
  REAL(bool (*)(Mutex*), "5Mutex13ReaderTryLockEv");
  const bool locked = real(this);
  if (locked) Acquire(this);
  return locked;
}
void Mutex::LockWhen(const Condition& cond) {
  REAL(void (*)(Mutex*, const Condition&), "5Mutex8LockWhenERKNS0_9ConditionE");
  Guarded g{this, &cond};
  real(this, absl::Condition(&EvalAcquired, &g));
  Acquire(this);
}
bool Mutex::LockWhenWithTimeout(const Condition& cond, Duration timeout) {
  REAL(bool (*)(Mutex*, const Condition&, Duration),
       "5Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  Guarded g{this, &cond};
  const bool met = real(this, absl::Condition(&EvalAcquired, &g), timeout);
  Acquire(this);  // held on return either way
  return met;
}
bool Mutex::LockWhenWithDeadline(const Condition& cond, Time deadline) {
  REAL(bool (*)(Mutex*, const Condition&, Time),
       "5Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  Guarded g{this, &cond};
  const bool met = real(this, absl::Condition(&EvalAcquired, &g), deadline);
  Acquire(this);
  return met;
}
void Mutex::ReaderLockWhen(const Condition& cond) {
  REAL(void (*)(Mutex*, const Condition&), "5Mutex14ReaderLockWhenERKNS0_9ConditionE");
  Guarded g{this, &cond};
  real(this, absl::Condition(&EvalAcquired, &g));
  Acquire(this);
}
void Mutex::Await(const Condition& cond) {
  REAL(void (*)(Mutex*, const Condition&), "5Mutex5AwaitERKNS0_9ConditionE");
  Guarded g{this, &cond};
  Release(this);
  real(this, absl::Condition(&EvalAcquired, &g));
  Acquire(this);
}
bool Mutex::AwaitWithTimeout(const Condition& cond, Duration timeout) {
  REAL(bool (*)(Mutex*, const Condition&, Duration),
       "5Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  Guarded g{this, &cond};
  Release(this);
  const bool met = real(this, absl::Condition(&EvalAcquired, &g), timeout);
  Acquire(this);
  return met;
}
bool Mutex::AwaitWithDeadline(const Condition& cond, Time deadline) {
  REAL(bool (*)(Mutex*, const Condition&, Time),
       "5Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  Guarded g{this, &cond};
  Release(this);
  const bool met = real(this, absl::Condition(&EvalAcquired, &g), deadline);
  Acquire(this);
  return met;
}

void CondVar::Wait(Mutex* mu) {
  REAL(void (*)(CondVar*, Mutex*), "7CondVar4WaitEPNS0_5MutexE");
  Release(mu);
  real(this, mu);
  Acquire(mu);
}
bool CondVar::WaitWithTimeout(Mutex* mu, Duration timeout) {
  REAL(bool (*)(CondVar*, Mutex*, Duration),
       "7CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  Release(mu);
  const bool timed_out = real(this, mu, timeout);
  Acquire(mu);
  return timed_out;
}
bool CondVar::WaitWithDeadline(Mutex* mu, Time deadline) {
  REAL(bool (*)(CondVar*, Mutex*, Time), "7CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  Release(mu);
  const bool timed_out = real(this, mu, deadline);
  Acquire(mu);
  return timed_out;
}

void Notification::Notify() {
  REAL(void (*)(Notification*), "12Notification6NotifyEv");
  Release(this);
  real(this);
}
void Notification::WaitForNotification() const {
  REAL_CONST(void (*)(const Notification*), "12Notification19WaitForNotificationEv");
  real(this);
  Acquire(this);
}
bool Notification::WaitForNotificationWithTimeout(Duration timeout) const {
  REAL_CONST(bool (*)(const Notification*, Duration),
             "12Notification30WaitForNotificationWithTimeoutENS0_8DurationE");
  const bool notified = real(this, timeout);
  if (notified) Acquire(this);
  return notified;
}
bool Notification::WaitForNotificationWithDeadline(Time deadline) const {
  REAL_CONST(bool (*)(const Notification*, Time),
             "12Notification31WaitForNotificationWithDeadlineENS0_4TimeE");
  const bool notified = real(this, deadline);
  if (notified) Acquire(this);
  return notified;
}

ABSL_NAMESPACE_END
}  // namespace absl
