// A small fork-join pool for the daemon's reduction kernels: ParallelFor
// splits an element range into contiguous chunks run by the pool's workers
// and the calling thread.
//
// Owns size() - 1 worker threads (the caller is the size()-th). Thread-safe:
// several job threads may call ParallelFor at once; their chunks share the
// workers, and a caller whose chunks find every worker busy runs them itself,
// so a call never waits on another caller's work. Workers sleep on a
// condition variable when idle (after a spin of a few microseconds), so an
// idle pool costs no CPU; the machine's cores belong to the trainers too.
#ifndef GRADD_COMMON_THREAD_POOL_H_
#define GRADD_COMMON_THREAD_POOL_H_

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"

namespace gradd {

class ThreadPool {
 public:
  // threads: total parallelism including the calling thread; 0 means
  // std::thread::hardware_concurrency().
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return size_; }

  // Runs fn(begin, end) over [0, n) split into at most size() contiguous
  // chunks of at least min_chunk elements (boundaries are multiples of 64
  // elements, so chunks of float/half buffers start on cache lines). The
  // calling thread runs chunks too; returns when every chunk is done. Runs
  // inline, without any hand-off, when n < 2 * min_chunk.
  void ParallelFor(size_t n, size_t min_chunk,
                   absl::FunctionRef<void(size_t, size_t)> fn);

 private:
  struct Job;

  void WorkerLoop();
  // Claims the next unclaimed chunk of `job`; false if none is left.
  bool Claim(Job* job, int* index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static void RunChunk(Job* job, int index);

  const int size_;
  // std::mutex rather than absl::Mutex: the pool is tiny, and pthread-based
  // locks are understood by ThreadSanitizer even with an uninstrumented
  // abseil build.
  std::mutex mu_;
  std::condition_variable work_cv_;
  // Jobs that still have unclaimed chunks, oldest first.
  std::deque<Job*> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // Mirror of queue_.size(), read without the lock by spinning workers.
  std::atomic<int> queued_{0};
  std::vector<std::thread> workers_;
};

}  // namespace gradd

#endif  // GRADD_COMMON_THREAD_POOL_H_
