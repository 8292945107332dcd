// IterationTracker: folds a job's bucket events (job_events.h) into one
// event per iteration: the step time (from the end of one iteration to the
// end of the next) and how much of the time buckets spent with the reducer
// overlapped backward (came before the iteration's last bucket was handed
// over), DDP's "backward_compute_comm_overlap".
//
// Thread-compatible: the job's completion thread only.
#ifndef GRADD_SERVER_ENGINE_OBSERVE_ITERATION_TRACKER_H_
#define GRADD_SERVER_ENGINE_OBSERVE_ITERATION_TRACKER_H_

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "server/engine/observe/job_events.h"

namespace gradd {

class IterationTracker {
 public:
  // Room for `max_buckets` buckets per iteration without allocating.
  explicit IterationTracker(size_t max_buckets) { spans_.reserve(max_buckets); }

  // The iteration's event when `bucket` was the last of its iteration.
  // Buckets of an iteration are expected before any of the next one; an
  // iteration left incomplete (a job error, a join round) is dropped.
  std::optional<IterationEvent> Add(const BucketEvent& bucket);

 private:
  uint64_t iteration_ = 0;
  int seen_ = 0;
  int64_t last_start_ns_ = 0;
  // (start, done) of each bucket of the iteration.
  std::vector<std::pair<int64_t, int64_t>> spans_;
  // The end of the last complete iteration.
  uint64_t ended_iteration_ = 0;
  int64_t ended_ns_ = 0;
};

}  // namespace gradd

#endif  // GRADD_SERVER_ENGINE_OBSERVE_ITERATION_TRACKER_H_
