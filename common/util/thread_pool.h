#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace tandem {

// A fixed set of worker threads for data-parallel kernels. ParallelFor is called from one thread
// at a time (an engine's step loop, or engines taking turns: engine::ComputeShare), and aborts if
// two overlap; the calling thread does a share of the work.
// Workers spin briefly before sleeping, since a forward pass issues hundreds of short jobs.
class ThreadPool {
 public:
  // `num_threads` counts the caller: 1 means no workers at all. 0 picks the hardware count.
  explicit ThreadPool(int num_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }
  // Workers asleep on the wake-up signal (not spinning, not working); for tests.
  int sleeping_workers() const { return sleeping_.load(std::memory_order_relaxed); }

  // Splits [0, n) into at most num_threads() contiguous ranges of at least `grain` items and
  // runs fn(begin, end) on each; returns when all are done.
  void ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

  // Like ParallelFor, but a thread that runs out of work takes some of another's, so a thread
  // slowed by a noisy neighbour does not hold the others at the barrier. Each thread starts on
  // its own contiguous share of the chunks and takes from its front, a quarter of what is left
  // of it at a time (single chunks at the end); a thread whose share is done takes the back
  // half of the largest share left and goes on with that as its own. So each thread walks up
  // through runs of neighbouring chunks (what a kernel that prefetches the next chunk wants),
  // and the takes touch a word no other thread writes until the work runs out. Each range is a
  // whole number of `chunk`s (the last may be cut at n).
  void ParallelForDynamic(int64_t n, int64_t chunk,
                          const std::function<void(int64_t, int64_t)>& fn);

 private:
  void WorkerLoop(int index);
  void RunShare(int index);
  // ParallelForDynamic's work of thread `self`: its own share, then what it can take from others.
  void RunDynamicShare(int self, int parts, int64_t n, int64_t chunk,
                       const std::function<void(int64_t, int64_t)>& fn);

  // A ParallelForDynamic share: chunks [begin, end) packed as end << 32 | begin, one cache line
  // each so a thread's takes from its own front do not contend with the other threads' takes.
  struct alignas(64) Share {
    std::atomic<uint64_t> range{0};
  };
  std::unique_ptr<Share[]> shares_;

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_;
  // Job state, published by `generation_` (release) and read by workers (acquire).
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0;
  int job_parts_ = 0;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
  std::atomic<int> sleeping_{0};
  std::atomic<bool> in_use_{false};  // a ParallelFor is running
};

// Returns a process-wide pool sized from TANDEM_NUM_THREADS or the hardware concurrency.
ThreadPool& DefaultThreadPool();

}  // namespace tandem
