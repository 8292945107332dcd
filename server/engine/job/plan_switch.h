// The engine's side of a plan switch (bucket rebuild; job.h "Plan
// switch"): waiting for the iteration boundary the ranks rebuild at, and
// the checks that make the switch safe. Which plan, and when every rank
// and node agrees on it, is rebuild.h's business.
//
//   idle --Begin(k)--> switching k --AtBoundary: kReached--> (Job swaps
//     ^                     |                                 the plan)
//     +------End()----------+-- kPassed: a bucket already ran past k (the
//                               job fails)
//
// Pure logic, owned by the engine thread: no threads, no I/O. The request
// itself (plan and answer) is what other threads leave in
// PlanSwitchRequests (plan_switch_requests.h).
#ifndef GRADD_SERVER_ENGINE_JOB_PLAN_SWITCH_H_
#define GRADD_SERVER_ENGINE_JOB_PLAN_SWITCH_H_

#include <cstddef>
#include <cstdint>

#include "absl/functional/function_ref.h"
#include "common/bucket_planner.h"

namespace gradd {

class PlanSwitch {
 public:
  bool switching() const { return switching_; }
  // The iteration after which the plan switches (while switching).
  uint64_t iteration() const { return iteration_; }

  // idle -> switching after iteration k. False (nothing changes) when a
  // switch is under way already.
  bool Begin(uint64_t k);
  // switching -> idle: switched, or given up (the job failed or stops).
  void End();

  // Where the engine stands against the boundary, over the plan's buckets
  // in order: started(b) is the iteration last handed to the reducer,
  // done(b) the last completed. The first bucket with iteration k still
  // in flight or not done says kNotYet; the first one done past k says
  // kPassed (`bucket`, `done`); every bucket done with exactly k:
  // kReached.
  enum class Boundary { kNotYet, kReached, kPassed };
  struct Check {
    Boundary boundary = Boundary::kNotYet;
    size_t bucket = 0;
    uint64_t done = 0;
  };
  Check AtBoundary(size_t num_buckets,
                   absl::FunctionRef<uint64_t(size_t)> started,
                   absl::FunctionRef<uint64_t(size_t)> done) const;

  // A rank that publishes iteration `next` while the ranks rebuild after
  // `rebuild_after` (0: none expected) skipped the rebuild the others wait
  // in.
  static bool SkipsRebuild(uint64_t rebuild_after, uint64_t next) {
    return rebuild_after != 0 && next > rebuild_after;
  }

  // What the job's memory holds for any plan (allocated once, so a switch
  // reallocates nothing): bucket slots in the control block, each rank's
  // bucket region and device region.
  struct Capacity {
    size_t bucket_slots = 0;
    size_t region_bytes = 0;
    size_t device_region_bytes = 0;
  };
  static bool Fits(const BucketPlan& plan, const Capacity& capacity);
  // Two plans put the same parameters in the same buckets.
  static bool SameBuckets(const BucketPlan& a, const BucketPlan& b);

 private:
  bool switching_ = false;
  uint64_t iteration_ = 0;
};

}  // namespace gradd

#endif  // GRADD_SERVER_ENGINE_JOB_PLAN_SWITCH_H_
