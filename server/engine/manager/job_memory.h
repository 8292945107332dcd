// What one job holds of the daemon's memory, checked against the config's
// max_job_memory_bytes at formation (every local rank attached): each
// rank's shared memory (bucket region sized for any plan, plus the
// broadcast area) and the device memory the daemon allocates for the job
// (each rank's CUDA bucket region on its GPU, plus the per-GPU
// accumulators of a job spread over several local GPUs). Both count
// against the one limit: device bytes are the daemon's allocation as well,
// and a job that may hold them must not starve the node's others.
//
// Sizes are before the device allocator rounds up to its granularity
// (cuMem: 2 MiB), so the real device footprint may be a little larger.
// Host staging (host_staging.h: pinned copies for hooks, join and
// multi-node CUDA buckets) is allocated on first use and is bounded by the
// device region; it is not part of the check.
#ifndef GRADD_SERVER_ENGINE_MANAGER_JOB_MEMORY_H_
#define GRADD_SERVER_ENGINE_MANAGER_JOB_MEMORY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/bucket_planner.h"

namespace gradd {

struct JobMemoryNeed {
  int ranks = 1;
  uint64_t shared_per_rank = 0;
  uint64_t device_per_rank = 0;
  // Device memory the reducer allocates once per GPU (accumulators).
  uint64_t device_extra = 0;

  uint64_t shared_bytes() const { return shared_per_rank * ranks; }
  uint64_t device_bytes() const {
    return device_per_rank * ranks + device_extra;
  }
  uint64_t total() const { return shared_bytes() + device_bytes(); }
};

// `rank_devices`: each local rank's GPU ordinal (-1: none), as the
// reducer groups them (cuda_bucket_reducer.h).
JobMemoryNeed JobMemoryNeedOf(const std::vector<ParamInfo>& params,
                              const BucketPlan& plan, uint64_t broadcast_bytes,
                              const std::vector<int>& rank_devices,
                              int num_nodes);

// OK, or RESOURCE_EXHAUSTED naming the shared and device bytes (per rank
// and in all) and the limit.
absl::Status CheckJobMemory(const std::string& job_id,
                            const JobMemoryNeed& need, uint64_t limit);

}  // namespace gradd

#endif  // GRADD_SERVER_ENGINE_MANAGER_JOB_MEMORY_H_
