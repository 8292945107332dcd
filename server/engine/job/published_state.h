// What a job's engine thread publishes for the other threads (the admin
// snapshot, the Attach replies, the events): where this node sits in the
// job now (a re-formation moves it), the job's phase, the current bucket
// plan and the last used map (find_unused_parameters).
//
// Threads: the engine thread writes the layout, phase and plan; a reducer
// completion records the used map; any thread reads. One mutex, held only
// to copy.
#ifndef GRADD_SERVER_ENGINE_JOB_PUBLISHED_STATE_H_
#define GRADD_SERVER_ENGINE_JOB_PUBLISHED_STATE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/bucket_planner.h"
#include "server/engine/job/job_snapshot.h"

namespace gradd {

class PublishedState {
 public:
  // Where this node sits in the job.
  struct Layout {
    int node_rank = 0;
    int num_nodes = 1;
    int world_size = 1;  // live global world size
    std::vector<std::string> node_ids;
    std::vector<std::string> lost;  // every node lost and not back
    std::string last_reason;        // of the last re-formation
  };
  explicit PublishedState(Layout layout) : layout_(std::move(layout)) {}
  PublishedState(const PublishedState&) = delete;
  PublishedState& operator=(const PublishedState&) = delete;

  Layout layout() const;
  int world_size() const;
  // Engine thread: a re-formation moved this node.
  void SetLayout(Layout layout);

  JobPhase phase() const;
  void SetPhase(JobPhase phase);

  // The plan the engine runs (null before the first PublishPlan).
  std::shared_ptr<const BucketPlan> plan() const;
  void PublishPlan(std::shared_ptr<const BucketPlan> plan);

  // The used map of `iteration`: the parameters no rank used (a map of an
  // iteration older than the last one recorded is dropped: completions
  // may run out of order).
  void RecordUnused(uint64_t iteration, std::vector<int32_t> unused);
  struct UsedMap {
    uint64_t iteration = 0;
    bool ever_unused = false;     // some iteration had unused parameters
    std::vector<int32_t> unused;  // only with `with_params`
  };
  UsedMap used_map(bool with_params) const;

 private:
  mutable absl::Mutex mu_;
  Layout layout_ ABSL_GUARDED_BY(mu_);
  JobPhase phase_ ABSL_GUARDED_BY(mu_) = JobPhase::kRunning;
  std::shared_ptr<const BucketPlan> plan_ ABSL_GUARDED_BY(mu_);
  uint64_t unused_iteration_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<int32_t> unused_ ABSL_GUARDED_BY(mu_);
  bool ever_unused_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace gradd

#endif  // GRADD_SERVER_ENGINE_JOB_PUBLISHED_STATE_H_
