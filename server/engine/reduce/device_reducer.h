// The engine's seam for CUDA buckets. WrapDeviceReducer gives a job whose
// plan has CUDA buckets a reducer that can reduce them; the engine itself
// stays device-agnostic (it hands BucketWork with device addresses).
//
//   host-addressable device memory (FakeDeviceAllocator, tests): the host
//       reducer as is — the "device" buffers are host memory;
//   real GPUs (GRADD_HAVE_CUDA): CudaBucketReducer (cuda/
//       cuda_bucket_reducer.h): CPU buckets go to the host reducer, CUDA
//       buckets are reduced on the GPU, ordered by interprocess events (no
//       host syncs);
//   otherwise: FAILED_PRECONDITION (a daemon built without CUDA never gets
//       this far: its NoDeviceAllocator refuses the attach).
//
// DeviceJobSpec is what a device reducer needs to know of its job. The job
// builds it from its JobSpec (JobSpec::device_spec(), job/job.h): reduce/
// sits below job/ (server/engine/README.md) and so does not see JobSpec.
// Thread-compatible: the JobManager's control thread, when a job activates.
#ifndef GRADD_SERVER_ENGINE_REDUCE_DEVICE_REDUCER_H_
#define GRADD_SERVER_ENGINE_REDUCE_DEVICE_REDUCER_H_

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/bucket_planner.h"
#include "common/device_memory.h"
#include "server/engine/formation/nccl_job_setup.h"
#include "server/engine/reduce/bucket_reducer.h"

namespace gradd {

struct DeviceJobSpec {
  std::string job_id;
  int local_world_size = 1;
  int node_rank = 0;
  int num_nodes = 1;
  // The job's global world size: what a bucket's sum is divided by.
  int world_size = 1;
  std::vector<ParamInfo> params;
  BucketPlan plan;
  // Where the per-GPU accumulators are allocated, and each local rank's
  // device ordinal as the daemon sees it (-1: none).
  DeviceAllocatorInterface* devices = nullptr;
  std::vector<int> rank_devices;
  // Bound on one device collective (NCCL) before the job fails.
  std::chrono::milliseconds collective_timeout{30000};
  // Multi-node: what the formation set up between the nodes
  // (formation/nccl_job_setup.h); null: not set up (staged).
  std::shared_ptr<NcclJobSetup> nccl_between_nodes;
};

absl::StatusOr<std::unique_ptr<BucketReducerInterface>> WrapDeviceReducer(
    const DeviceJobSpec& spec, std::unique_ptr<BucketReducerInterface> host);

// Whether some parameter lives on a CUDA device.
bool HasCudaParams(const std::vector<ParamInfo>& params);

// Whether WrapDeviceReducer gives a job with `params` whose CUDA buckets
// `devices` (may be null) allocates a device reducer (CUDA parameters on
// real GPUs).
bool UsesDeviceReducer(const std::vector<ParamInfo>& params,
                       const DeviceAllocatorInterface* devices);

}  // namespace gradd

#endif  // GRADD_SERVER_ENGINE_REDUCE_DEVICE_REDUCER_H_
