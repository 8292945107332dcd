// The engine's seam for CUDA buckets. WrapDeviceReducer gives a job whose
// plan has CUDA buckets a reducer that can reduce them; the engine itself
// stays device-agnostic (it hands BucketWork with device addresses).
//
//   host-addressable device memory (FakeDeviceAllocator, tests): the host
//       reducer as is — the "device" buffers are host memory;
//   real GPUs (GRADD_HAVE_CUDA): CudaBucketReducer (cuda_bucket_reducer.h):
//       CPU buckets go to the host reducer, CUDA buckets are reduced on the
//       GPU, ordered by interprocess events (no host syncs);
//   otherwise: FAILED_PRECONDITION (a daemon built without CUDA never gets
//       this far: its NoDeviceAllocator refuses the attach).
//
// DaemonNcclJobPlatform: what a multi-node CUDA job's formation sets NCCL
// between the nodes up with (nccl_job_setup.h): the process's NCCL and
// driver on real GPUs, null in a daemon built without CUDA.
#ifndef GRADD_SERVER_ENGINE_REDUCE_DEVICE_REDUCER_H_
#define GRADD_SERVER_ENGINE_REDUCE_DEVICE_REDUCER_H_

#include <memory>

#include "absl/status/statusor.h"
#include "server/engine/formation/nccl_job_setup.h"
#include "server/engine/job/job.h"
#include "server/engine/reduce/bucket_reducer.h"

namespace gradd {

absl::StatusOr<std::unique_ptr<BucketReducerInterface>> WrapDeviceReducer(
    const JobSpec& spec, std::unique_ptr<BucketReducerInterface> host);

// Whether WrapDeviceReducer gives `spec`'s job a device reducer (CUDA
// parameters on real GPUs).
bool UsesDeviceReducer(const JobSpec& spec);

// Process-wide, never freed; any thread.
NcclJobPlatformInterface* DaemonNcclJobPlatform();

}  // namespace gradd

#endif  // GRADD_SERVER_ENGINE_REDUCE_DEVICE_REDUCER_H_
