#include "common/util/thread_pool.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace tandem {
namespace {
constexpr int kSpinIterations = 20000;

uint64_t PackRange(int64_t begin, int64_t end) {
  return static_cast<uint64_t>(end) << 32 | static_cast<uint64_t>(begin);
}
int64_t RangeBegin(uint64_t range) { return static_cast<int64_t>(range & 0xFFFFFFFFu); }
int64_t RangeEnd(uint64_t range) { return static_cast<int64_t>(range >> 32); }
}  // namespace

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads <= 0) num_threads = std::max(1u, std::thread::hardware_concurrency());
  shares_ = std::make_unique<Share[]>(num_threads);
  for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::RunShare(int index) {
  int64_t per = (job_n_ + job_parts_ - 1) / job_parts_;
  int64_t begin = std::min<int64_t>(job_n_, per * index);
  int64_t end = std::min<int64_t>(job_n_, begin + per);
  if (begin < end) (*job_)(begin, end);
}

void ThreadPool::ParallelFor(int64_t n, int64_t grain,
                             const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  int parts = static_cast<int>(std::min<int64_t>(num_threads(), (n + grain - 1) / grain));
  if (parts <= 1) {
    fn(0, n);
    return;
  }
  // Two callers at once would overwrite each other's job: fail loudly rather than corrupt it.
  if (in_use_.exchange(true, std::memory_order_acquire)) {
    std::fprintf(stderr, "ThreadPool::ParallelFor called from two threads at once\n");
    std::abort();
  }
  job_ = &fn;
  job_n_ = n;
  job_parts_ = parts;
  pending_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(mu_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  RunShare(0);
  while (pending_.load(std::memory_order_acquire) != 0) _mm_pause();
  in_use_.store(false, std::memory_order_release);
}

void ThreadPool::ParallelForDynamic(int64_t n, int64_t chunk,
                                    const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  chunk = std::max<int64_t>(1, chunk);
  // Chunk indices are packed in 32 bits; doubling the chunk keeps every range a multiple of it.
  while ((n + chunk - 1) / chunk > int64_t{1} << 31) chunk *= 2;
  const int64_t chunks = (n + chunk - 1) / chunk;
  if (chunks <= 1 || num_threads() == 1) {
    fn(0, n);
    return;
  }
  // Contiguous shares, rather than takes from one shared counter: the counter's cache line went
  // back and forth between the cores on every take (a contended update measured 5% of a
  // 125M-shape decode step), and its takes interleaved the threads at the end, so a thread's
  // next chunk was seldom the one its kernel had prefetched. 1.06-1.29x on the batch-1 GEMVs of
  // the 125M and 1B shapes on Zen 3 (docs/benchmarks.md).
  const int parts = static_cast<int>(std::min<int64_t>(num_threads(), chunks));
  for (int t = 0; t < parts; ++t) {
    shares_[t].range.store(PackRange(t * chunks / parts, (t + 1) * chunks / parts),
                           std::memory_order_relaxed);
  }
  // (ParallelFor publishes the shares to the workers.)
  ParallelFor(parts, 1, [&](int64_t self, int64_t) {
    RunDynamicShare(static_cast<int>(self), parts, n, chunk, fn);
  });
}

void ThreadPool::RunDynamicShare(int self, int parts, int64_t n, int64_t chunk,
                                 const std::function<void(int64_t, int64_t)>& fn) {
  std::atomic<uint64_t>& own = shares_[self].range;
  for (;;) {
    // From the front of the own share; another thread may take its back at any time.
    uint64_t range = own.load(std::memory_order_relaxed);
    for (int64_t b = RangeBegin(range), e = RangeEnd(range); b < e;
         b = RangeBegin(range), e = RangeEnd(range)) {
      const int64_t take = std::max<int64_t>(1, (e - b) / 4);
      if (!own.compare_exchange_weak(range, PackRange(b + take, e), std::memory_order_relaxed)) {
        continue;
      }
      fn(b * chunk, std::min(n, (b + take) * chunk));
      range = own.load(std::memory_order_relaxed);
    }
    // The own share is done: the back half of the largest one left becomes the own share. Only
    // this thread writes its empty share; the others only take from shares they saw non-empty.
    int victim = -1;
    int64_t most = 0;
    for (int v = 0; v < parts; ++v) {
      const uint64_t r = shares_[v].range.load(std::memory_order_relaxed);
      if (RangeEnd(r) - RangeBegin(r) > most) most = RangeEnd(r) - RangeBegin(r), victim = v;
    }
    if (victim < 0) return;
    uint64_t r = shares_[victim].range.load(std::memory_order_relaxed);
    const int64_t b = RangeBegin(r), e = RangeEnd(r);
    if (b >= e) continue;
    const int64_t take = (e - b + 1) / 2;
    if (!shares_[victim].range.compare_exchange_strong(r, PackRange(b, e - take),
                                                       std::memory_order_relaxed)) {
      continue;
    }
    own.store(PackRange(e - take, e), std::memory_order_relaxed);
  }
}

void ThreadPool::WorkerLoop(int index) {
  uint64_t seen = 0;
  for (;;) {
    int spins = 0;
    while (generation_.load(std::memory_order_acquire) == seen && spins < kSpinIterations) {
      _mm_pause();
      ++spins;
    }
    if (generation_.load(std::memory_order_acquire) == seen) {
      std::unique_lock<std::mutex> lock(mu_);
      sleeping_.fetch_add(1, std::memory_order_relaxed);
      wake_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
      sleeping_.fetch_sub(1, std::memory_order_relaxed);
    }
    seen = generation_.load(std::memory_order_acquire);
    if (stop_.load()) return;
    if (index < job_parts_) RunShare(index);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

ThreadPool& DefaultThreadPool() {
  static ThreadPool* pool = [] {
    int n = 0;
    if (const char* env = std::getenv("TANDEM_NUM_THREADS")) n = std::atoi(env);
    return new ThreadPool(n);
  }();
  return *pool;
}

}  // namespace tandem
