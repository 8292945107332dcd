#include "common/thread_pool.h"

#include <algorithm>
#include <chrono>

#include "common/doorbell.h"

namespace gradd {
namespace {

constexpr size_t kChunkGranule = 64;

// How long a worker that just finished a chunk polls for more before
// sleeping: long enough to pick up back-to-back buckets without a futex
// round trip, short enough not to steal a trainer's core.
constexpr std::chrono::microseconds kWorkerSpin(20);

}  // namespace

struct ThreadPool::Job {
  Job(absl::FunctionRef<void(size_t, size_t)> f, size_t n_, size_t per_,
      int chunks_)
      : fn(f), n(n_), per(per_), chunks(chunks_), remaining(chunks_) {}

  absl::FunctionRef<void(size_t, size_t)> fn;
  const size_t n;
  const size_t per;  // elements per chunk (the last may be shorter)
  const int chunks;
  int next = 0;  // guarded by the pool's mu_
  // Chunks not yet finished; the caller futex-waits on it. A worker must
  // not touch the job after its decrement except for the futex wake, which
  // only uses the address (harmless if the caller already returned).
  std::atomic<uint32_t> remaining;
};

ThreadPool::ThreadPool(int threads)
    : size_(threads > 0
                ? threads
                : std::max(1, static_cast<int>(
                                  std::thread::hardware_concurrency()))) {
  workers_.reserve(size_ - 1);
  for (int i = 1; i < size_; ++i) {
    workers_.emplace_back([this] { WorkerLoop(); });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

bool ThreadPool::Claim(Job* job, int* index) {
  if (job->next >= job->chunks) return false;
  *index = job->next++;
  if (job->next == job->chunks) {
    auto it = std::find(queue_.begin(), queue_.end(), job);
    if (it != queue_.end()) {
      queue_.erase(it);
      queued_.fetch_sub(1, std::memory_order_relaxed);
    }
  }
  return true;
}

void ThreadPool::RunChunk(Job* job, int index) {
  const size_t begin = static_cast<size_t>(index) * job->per;
  const size_t end = std::min(job->n, begin + job->per);
  job->fn(begin, end);
  if (job->remaining.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    FutexWakeAll(&job->remaining);
  }
}

void ThreadPool::WorkerLoop() {
  bool was_busy = false;
  while (true) {
    if (was_busy) {
      const auto until = std::chrono::steady_clock::now() + kWorkerSpin;
      while (queued_.load(std::memory_order_relaxed) == 0 &&
             std::chrono::steady_clock::now() < until) {
        doorbell_internal::CpuRelax();
      }
    }
    Job* job = nullptr;
    int index = 0;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return !queue_.empty() || stop_;
      });
      if (queue_.empty()) return;  // stop_ and nothing left to do
      job = queue_.front();
      Claim(job, &index);  // a queued job always has a chunk left
    }
    RunChunk(job, index);
    was_busy = true;
  }
}

void ThreadPool::ParallelFor(size_t n, size_t min_chunk,
                             absl::FunctionRef<void(size_t, size_t)> fn) {
  if (n == 0) return;
  min_chunk = std::max<size_t>(min_chunk, 1);
  // Small ranges (a 4 KiB bucket) must not pay a thread hand-off.
  if (size_ == 1 || n < 2 * min_chunk) {
    fn(0, n);
    return;
  }
  size_t want = std::min<size_t>(static_cast<size_t>(size_), n / min_chunk);
  size_t per = (n + want - 1) / want;
  per = (per + kChunkGranule - 1) / kChunkGranule * kChunkGranule;
  const int chunks = static_cast<int>((n + per - 1) / per);
  if (chunks <= 1) {
    fn(0, n);
    return;
  }

  Job job(fn, n, per, chunks);
  int index = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Claim(&job, &index);  // the caller's own first chunk, before any worker
    queue_.push_back(&job);
    queued_.fetch_add(1, std::memory_order_relaxed);
  }
  for (int i = 1; i < chunks; ++i) work_cv_.notify_one();

  // Run our chunk, then any the workers have not picked up yet (they may be
  // busy with another caller's job).
  while (true) {
    RunChunk(&job, index);
    std::lock_guard<std::mutex> lock(mu_);
    if (!Claim(&job, &index)) break;
  }

  // Wait for chunks running on workers: spin briefly (they started at most
  // one chunk-length ago), then sleep on the counter.
  const auto spin_until =
      std::chrono::steady_clock::now() + std::chrono::microseconds(50);
  while (true) {
    uint32_t left = job.remaining.load(std::memory_order_acquire);
    if (left == 0) return;
    if (std::chrono::steady_clock::now() < spin_until) {
      doorbell_internal::CpuRelax();
      continue;
    }
    FutexWait(&job.remaining, left, std::chrono::milliseconds(100));
  }
}

}  // namespace gradd
