// The checks of Attach requests that need nothing but the requests and the
// daemon's config: one request against the daemon's limits, before its rank
// is bound (ValidateAttachRequest), and, once every local rank of a job has
// attached, each rank's request against local rank 0's (CompareLocalAttach,
// CompareNodeSetup). The JobManager runs them on its control thread
// (job_manager_attach.cc); pure functions, any thread.
//
// Errors: INVALID_ARGUMENT naming the job, the local rank, the parameter or
// setting at fault (and both ranks where two disagree); RESOURCE_EXHAUSTED
// for a request over the daemon's limits (parameters, memory).
#ifndef GRADD_SERVER_ENGINE_MANAGER_ATTACH_VALIDATION_H_
#define GRADD_SERVER_ENGINE_MANAGER_ATTACH_VALIDATION_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/bucket_planner.h"
#include "gradd/v1/config.pb.h"
#include "gradd/v1/node.pb.h"

namespace gradd {

// Static checks of one Attach request against the daemon's limits; returns
// the parameters in planner form.
absl::StatusOr<std::vector<ParamInfo>> ValidateAttachRequest(
    const v1::AttachRequest& request, const v1::DaemonConfig& config);

// The number of nodes the request's job spans (num_nodes 0: one).
int NumNodes(const v1::AttachRequest& request);

// The first difference between local rank 0's request (`first`, its
// parameters `first_params`) and local rank `rank`'s in what every local
// rank of a job must agree on: the model, the bucket caps (the daemon's
// defaults standing in for caps not given), the communication hook, the
// broadcast area. OK when they agree.
absl::Status CompareLocalAttach(const std::string& job_id, int rank,
                                const v1::AttachRequest& first,
                                const std::vector<ParamInfo>& first_params,
                                const v1::AttachRequest& other,
                                const std::vector<ParamInfo>& other_params,
                                const v1::DaemonConfig& config);

// The same for the multi-node setup (num_nodes, node rank, node id,
// coordinator).
absl::Status CompareNodeSetup(const std::string& job_id, int rank,
                              const v1::AttachRequest& first,
                              const v1::AttachRequest& other);

// The bucket caps `request` asked for, the daemon's defaults where it asked
// for none.
PlannerOptions PlannerOptionsFor(const v1::AttachRequest& request,
                                 const v1::DaemonConfig& config);

}  // namespace gradd

#endif  // GRADD_SERVER_ENGINE_MANAGER_ATTACH_VALIDATION_H_
