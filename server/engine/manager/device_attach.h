// The GPU side of an attach: which of the daemon's GPUs a rank's CUDA
// parameters live on, checked at the rank's Attach (before it waits for the
// others), so a trainer whose device the daemon cannot use hears why at
// once:
//   FAILED_PRECONDITION  the daemon has no CUDA driver / was built without
//                        CUDA ("CUDA parameters but this daemon has no CUDA
//                        driver (...)"), or the trainer's driver version
//                        differs from the daemon's;
//   NOT_FOUND            the daemon cannot see the trainer's GPU (UUID and
//                        the GPUs it sees named).
// Every message names the job and rank. Thread-compatible (the JobManager's
// thread).
#ifndef GRADD_SERVER_ENGINE_MANAGER_DEVICE_ATTACH_H_
#define GRADD_SERVER_ENGINE_MANAGER_DEVICE_ATTACH_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/bucket_planner.h"
#include "common/device_memory.h"
#include "gradd/v1/node.pb.h"

namespace gradd {

// The daemon's ordinal of the rank's GPU, or -1 when no parameter is on
// CUDA. `who`: "local rank 1 of job 'j'".
absl::StatusOr<int> ResolveRankDevice(const v1::AttachRequest& request,
                                      const std::vector<ParamInfo>& params,
                                      DeviceAllocatorInterface& devices,
                                      const std::string& who);

}  // namespace gradd

#endif  // GRADD_SERVER_ENGINE_MANAGER_DEVICE_ATTACH_H_
