#include "common/util/thread_pool.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace tandem {
namespace {
constexpr int kSpinIterations = 20000;
}  // namespace

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads <= 0) num_threads = std::max(1u, std::thread::hardware_concurrency());
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
  const int64_t chunks = (n + chunk - 1) / chunk;
  if (chunks <= 1 || num_threads() == 1) {
    fn(0, n);
    return;
  }
  // Guided: each take is a 1/(kShares * threads) share of what is left, at least one chunk, so
  // a GEMM of hundreds of blocks costs tens of atomic updates, not hundreds (a contended update
  // measured 5% of a 125M-shape decode step), and the last takes are single chunks.
  constexpr int64_t kShares = 4;
  const int64_t divisor = kShares * num_threads();
  std::atomic<int64_t> next{0};
  ParallelFor(std::min<int64_t>(num_threads(), chunks), 1, [&](int64_t, int64_t) {
    int64_t c = next.load(std::memory_order_relaxed);
    while (c < chunks) {
      const int64_t take = std::max<int64_t>(1, (chunks - c) / divisor);
      if (!next.compare_exchange_weak(c, c + take, std::memory_order_relaxed)) continue;
      fn(c * chunk, std::min(n, (c + take) * chunk));
      c = next.load(std::memory_order_relaxed);
    }
  });
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
