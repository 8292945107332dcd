// PendingJob: a job whose local ranks are attaching, until it becomes an
// active Job (job_manager.h, "A job's life"). One per job id in the
// JobManager's pending_ map; pure logic, owned by the control thread.
//
//   collecting --Add of the last local rank--> complete (FormJob checks,
//      |                                        plans, then activates it or
//      |                                        StartForming)
//      |                                           |
//      |                                        forming (the formation
//      |                                        thread answers every rank)
//   Take (detach, session closed, Attach cancelled) / TakeExpired:
//      collecting: that rank's slot frees; the job goes once empty();
//      forming: the whole job fails (the other nodes wait for all of it),
//               which JobManager::WithdrawPendingRank does.
//
// A forming job's ranks are not timed out one by one: the formation is
// bounded by the earliest of their deadlines (job_manager_formation.cc).
#ifndef GRADD_SERVER_ENGINE_MANAGER_PENDING_JOB_H_
#define GRADD_SERVER_ENGINE_MANAGER_PENDING_JOB_H_

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "common/bucket_planner.h"
#include "gradd/v1/node.pb.h"
#include "server/rpc/node_handler.h"

namespace gradd {

// One local rank's Attach, waiting for the job to form.
struct PendingRank {
  v1::AttachRequest request;
  std::vector<ParamInfo> params;
  absl::Time deadline;
  NodeHandlerInterface::AttachCallback done;
  // The daemon's ordinal of the rank's GPU; -1: no CUDA parameters.
  int device = -1;
};

class PendingJob {
 public:
  explicit PendingJob(int world) : ranks_(world) {}

  int world() const { return static_cast<int>(ranks_.size()); }
  // How many local ranks are in.
  int count() const { return count_; }
  bool empty() const { return count_ == 0; }
  bool complete() const { return count_ == world(); }
  // Local rank `r`'s attach (nullopt: not attached); r in [0, world()).
  const std::optional<PendingRank>& rank(int r) const { return ranks_[r]; }
  const std::vector<std::optional<PendingRank>>& ranks() const {
    return ranks_;
  }

  // The multi-node formation's number while it runs (0: not forming).
  uint64_t formation() const { return formation_; }
  bool forming() const { return formation_ != 0; }
  void StartForming(uint64_t formation) { formation_ = formation; }

  // Rank `r` attaches (its slot must be free). True when that completes
  // the job.
  bool Add(int r, PendingRank attach);
  // Takes rank `r`'s attach out (nullopt when it has none).
  std::optional<PendingRank> Take(int r);
  // The local ranks not attached, in order.
  std::vector<int> Missing() const;
  // While collecting: takes out the attaches whose deadline is at or before
  // `now`, by local rank. Nothing while forming.
  std::vector<std::pair<int, PendingRank>> TakeExpired(absl::Time now);
  // The earliest deadline of the attaches in (InfiniteFuture when none, or
  // while forming).
  absl::Time NextDeadline() const;
  // Takes every attach out (the job failed or the manager stops).
  std::vector<PendingRank> TakeAll();

 private:
  std::vector<std::optional<PendingRank>> ranks_;
  int count_ = 0;
  uint64_t formation_ = 0;
};

}  // namespace gradd

#endif  // GRADD_SERVER_ENGINE_MANAGER_PENDING_JOB_H_
