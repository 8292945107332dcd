// Puts a job's collectives into plan order. The engine starts a bucket as
// soon as every local rank made it ready, so bucket 3 can start before
// bucket 2 when its gradients happen to be ready first; a collective
// library that matches calls by their order on each communicator (NCCL)
// would then pair node A's bucket 3 with node B's bucket 2. The gate holds
// such a bucket back until every bucket before it in (iteration, plan
// index) order has been started, then releases it, so every node issues
// the same sequence.
//
// The sequence is the plan's buckets marked `ordered` (the CUDA ones: CPU
// buckets such as the used map go their own way and are not waited for).
// Each of them passes through the gate every iteration, including those
// that go another way this time (staged ones): those pass at once (`issue`
// null) and only move the cursor, since every node starts the same buckets
// the same way (the engine's rules and the hook / join agreements are the
// same on every node). A bucket outside the sequence runs at once.
//
//   cursor (i, b) --Arrive(i, b)--> release (i, b), then every held
//                                   successor whose predecessors arrived
//   Arrive(i', b') ahead of cursor --> held
//
// Iterations count from `first_iteration` (the engine's first is 1) with
// the plan's buckets until Replan. Thread-compatible: the engine
// thread only; released items run inline on it, in order.
#ifndef GRADD_SERVER_ENGINE_REDUCE_PLAN_ORDER_GATE_H_
#define GRADD_SERVER_ENGINE_REDUCE_PLAN_ORDER_GATE_H_

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"

namespace gradd {

class PlanOrderGate {
 public:
  // Called once: with OK when its turn comes, or with the error of Cancel.
  using Issue = absl::AnyInvocable<void(absl::Status) &&>;

  // ordered[b]: bucket b of the plan is in the sequence.
  explicit PlanOrderGate(std::vector<bool> ordered,
                         uint64_t first_iteration = 1) {
    Reset(std::move(ordered), first_iteration);
  }
  ~PlanOrderGate() { Cancel(absl::CancelledError("the job is stopping")); }

  // Bucket `bucket` of `iteration` started; `issue` (may be null: nothing
  // to order) runs now or once its predecessors have arrived. A bucket
  // behind the cursor (started twice) or outside the plan runs at once
  // with INTERNAL: ordering it is impossible.
  void Arrive(uint64_t iteration, int bucket, Issue issue);
  // From `first_iteration` on, the buckets `ordered` says (a rebuild);
  // what is still held is cancelled (nothing should be).
  void Replan(uint64_t first_iteration, std::vector<bool> ordered);
  // Every held item runs with `why` (shutdown).
  void Cancel(const absl::Status& why);
  size_t held() const { return held_.size(); }

 private:
  void Reset(std::vector<bool> ordered, uint64_t first_iteration);
  // The cursor to the next bucket of the sequence.
  void Advance();
  std::vector<bool> ordered_;
  bool any_ordered_ = false;
  uint64_t iteration_ = 1;
  int bucket_ = 0;
  // Arrived ahead of the cursor: key -> item (null: pass-through).
  std::map<std::pair<uint64_t, int>, Issue> held_;
};

}  // namespace gradd

#endif  // GRADD_SERVER_ENGINE_REDUCE_PLAN_ORDER_GATE_H_
