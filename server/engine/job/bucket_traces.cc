#include "server/engine/job/bucket_traces.h"

#include <algorithm>
#include <optional>

namespace gradd {

BucketTraces::BucketTraces(int world, size_t max_buckets)
    : world_(static_cast<size_t>(world)), iterations_(max_buckets) {}

void BucketTraces::Reset(const BucketPlan& plan) {
  const size_t n = plan.buckets.size();
  traces_.assign(n, Trace());
  rank_ready_ns_.assign(n * world_ <= kMaxTrackedReadies ? n * world_ : 0, 0);
  first_ready_iter_.assign(n, 0);
  first_ready_ns_.assign(n, 0);
  bytes_.resize(n);
  for (size_t b = 0; b < n; ++b) bytes_[b] = plan.buckets[b].size_bytes;
  num_buckets_.store(static_cast<int>(n), std::memory_order_relaxed);
}

BucketTiming* BucketTraces::Started(size_t b, uint64_t iteration,
                                    int64_t start_ns) {
  Trace& trace = traces_[b];
  trace.iteration = iteration;
  trace.first_ready_ns =
      first_ready_iter_[b] == iteration ? first_ready_ns_[b] : 0;
  trace.start_ns = start_ns;
  trace.timing = BucketTiming();
  return &trace.timing;
}

void BucketTraces::Emit(int b, uint64_t iteration, int64_t done_ns,
                        JobEventSinkInterface* sink) {
  const Trace& trace = traces_[b];
  if (trace.iteration != iteration) return;  // not started by Started
  BucketEvent e;
  e.iteration = iteration;
  e.bucket = b;
  e.num_buckets = num_buckets_.load(std::memory_order_relaxed);
  e.bytes = bytes_[b];
  e.first_ready_ns = trace.first_ready_ns;
  e.start_ns = trace.start_ns;
  e.done_ns = done_ns;
  e.phases = trace.timing;
  int64_t* ready = nullptr;
  if (!rank_ready_ns_.empty()) {
    ready = &rank_ready_ns_[b * world_];
    e.rank_ready_ns = absl::MakeConstSpan(ready, world_);
  }
  sink->OnBucket(e);
  if (std::optional<IterationEvent> it = iterations_.Add(e)) {
    sink->OnIteration(*it);
  }
  if (ready != nullptr) std::fill(ready, ready + world_, 0);
}

void BucketTraces::ForgetWaits() {
  std::fill(first_ready_iter_.begin(), first_ready_iter_.end(), 0);
  std::fill(rank_ready_ns_.begin(), rank_ready_ns_.end(), 0);
}

}  // namespace gradd
