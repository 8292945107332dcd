// What a job's engine keeps of each bucket of its plan for the events
// (observe/job_events.h): when some local rank first handed the bucket
// over and when each one did, when the engine handed it to the reducer
// and the reducer's phase timing; and what the completion makes of them,
// the bucket's event and, at the last bucket of an iteration, the
// iteration's (IterationTracker).
//
// Threads: the engine thread writes a bucket's trace until the bucket
// starts (NoteReady, Started) and reads the waits (stall checks); the
// completion (any thread, one per bucket in flight) reads the trace, then
// clears the per-rank times, before done_seq is published, so the engine
// may reuse the bucket's trace once it sees done. Reset and ForgetWaits
// only while no bucket is with the reducer. Nothing here locks: the
// control block's done_seq orders the hand-over.
#ifndef GRADD_SERVER_ENGINE_JOB_BUCKET_TRACES_H_
#define GRADD_SERVER_ENGINE_JOB_BUCKET_TRACES_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/bucket_planner.h"
#include "server/engine/observe/iteration_tracker.h"
#include "server/engine/observe/job_events.h"
#include "server/engine/reduce/bucket_reducer.h"

namespace gradd {

class BucketTraces {
 public:
  // `world`: local ranks; `max_buckets`: the most buckets a plan of the
  // job can have (room for an iteration without allocating).
  BucketTraces(int world, size_t max_buckets);
  BucketTraces(const BucketTraces&) = delete;
  BucketTraces& operator=(const BucketTraces&) = delete;

  // Engine thread: sized to `plan`, nothing seen yet. Per-rank times are
  // kept while buckets x ranks is at most kMaxTrackedReadies.
  void Reset(const BucketPlan& plan);
  static constexpr size_t kMaxTrackedReadies = size_t{1} << 20;

  // Engine thread, in the scan: local rank r made bucket b ready for
  // `iteration`. `*now` is the scan's clock reading, read here (`clock`)
  // when it is still 0, so a scan reads the clock at most once.
  template <typename Clock>
  void NoteReady(size_t b, int r, uint64_t iteration, int64_t* now,
                 Clock clock) {
    if (first_ready_iter_[b] != iteration) {
      if (*now == 0) *now = clock();
      first_ready_iter_[b] = iteration;
      first_ready_ns_[b] = *now;
    }
    if (rank_ready_ns_.empty()) return;
    int64_t& ready = rank_ready_ns_[b * world_ + r];
    if (ready != 0) return;
    if (*now == 0) *now = clock();
    ready = *now;
  }
  // Engine thread: bucket b of `iteration` goes to the reducer at
  // `start_ns`. Returns where the reducer records its phases
  // (BucketWork::timing).
  BucketTiming* Started(size_t b, uint64_t iteration, int64_t start_ns);
  // The bucket's completion, before done_seq is published: bucket b of
  // `iteration` done at `done_ns`; its events (and the iteration's, at
  // its last bucket) to `sink`. Nothing for a bucket Started did not see
  // (e.g. an aborted one).
  void Emit(int b, uint64_t iteration, int64_t done_ns,
            JobEventSinkInterface* sink);
  // Engine thread, an iteration aborted: every bucket's wait is over.
  void ForgetWaits();

  // Engine thread (stall checks): the iteration bucket b was first seen
  // ready for (0: none) and when; when it was handed to the reducer.
  uint64_t first_ready_iteration(size_t b) const {
    return first_ready_iter_[b];
  }
  int64_t first_ready_ns(size_t b) const { return first_ready_ns_[b]; }
  int64_t started_ns(size_t b) const { return traces_[b].start_ns; }

 private:
  struct Trace {
    uint64_t iteration = 0;
    int64_t first_ready_ns = 0;
    int64_t start_ns = 0;
    BucketTiming timing;
  };

  const size_t world_;
  std::vector<Trace> traces_;
  std::vector<uint64_t> bytes_;  // bucket sizes, for the completion
  // rank_ready_ns_[b * world + r]: when local rank r handed bucket b over
  // (0: not yet); empty when the plan and world are too large to track.
  std::vector<int64_t> rank_ready_ns_;
  // Engine thread only.
  std::vector<uint64_t> first_ready_iter_;
  std::vector<int64_t> first_ready_ns_;
  // Buckets in the plan, for the completion thread.
  std::atomic<int> num_buckets_{0};
  // Completion thread only.
  IterationTracker iterations_;
};

}  // namespace gradd

#endif  // GRADD_SERVER_ENGINE_JOB_BUCKET_TRACES_H_
