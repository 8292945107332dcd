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

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/bucket_planner.h"
#include "gradd/v1/config.pb.h"
#include "gradd/v1/node.pb.h"
#include "server/engine/job/bucket_autotune.h"

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
// broadcast area, the rank restart grace, min_nodes and (multi-node)
// divide_by_initial_world_size. OK when they agree.
absl::Status CompareLocalAttach(const std::string& job_id, int rank,
                                const v1::AttachRequest& first,
                                const std::vector<ParamInfo>& first_params,
                                const v1::AttachRequest& other,
                                const std::vector<ParamInfo>& other_params,
                                const v1::DaemonConfig& config);

// The rank restart grace a job asked for (AttachRequest.rank_restart_grace_ms)
// or, unset, the daemon's (config.rank_restart_grace_ms), for single- and
// multi-node jobs alike.
uint32_t EffectiveRankRestartGrace(const v1::AttachRequest& request,
                                   const v1::DaemonConfig& config);

// The smallest node count a multi-node job goes on with
// (AttachRequest.min_nodes or, unset, the daemon's min_nodes, capped at the
// job's num_nodes); 0 for a single-node job, which has no nodes to lose.
// ValidateAttachRequest refuses a job's own min_nodes above num_nodes.
int EffectiveMinNodes(const v1::AttachRequest& request,
                      const v1::DaemonConfig& config);

// Whether a job re-forms its inter-node group instead of failing when a
// node is lost, arrives or a rank of it restarts (job.h "Elastic multi-node
// jobs"): more than one node, and min_nodes or a rank restart grace.
bool IsReformableAcrossNodes(int num_nodes, int min_nodes,
                             uint32_t rank_restart_grace_ms);

// A restarted local rank `rank` attaching again to its running job
// (`local_world_size` ranks, parameters `job_params`, a broadcast area of
// `broadcast_bytes`): the first difference between what the job runs and
// what `request` (its parameters `params`) asks for, INVALID_ARGUMENT
// naming it; OK when they are the same.
absl::Status CompareRestartAttach(const std::string& job_id, int rank,
                                  int local_world_size,
                                  const std::vector<ParamInfo>& job_params,
                                  uint64_t broadcast_bytes,
                                  const v1::AttachRequest& request,
                                  const std::vector<ParamInfo>& params);

// The same for the multi-node setup (num_nodes, node rank, node id,
// coordinator).
absl::Status CompareNodeSetup(const std::string& job_id, int rank,
                              const v1::AttachRequest& first,
                              const v1::AttachRequest& other);

// The bucket caps `request` asked for, the daemon's defaults where it asked
// for none.
PlannerOptions PlannerOptionsFor(const v1::AttachRequest& request,
                                 const v1::DaemonConfig& config);
// Whether the job autotunes its bucket cap (engine/job/bucket_autotune.h):
// the trainer asked for `auto`, or left the cap to a daemon configured
// with `bucket_cap_mb: auto`, and its client follows plan switches.
bool AutotunesBucketCap(const v1::AttachRequest& request,
                        const v1::DaemonConfig& config);
// What autotune tries (config's autotune_*; the defaults where unset or,
// in a config that was not validated, bad).
// `multi_node`: the partitions too (autotune_partitions_mb).
AutotuneOptions AutotuneOptionsOf(const v1::DaemonConfig& config,
                                  bool multi_node);

}  // namespace gradd

#endif  // GRADD_SERVER_ENGINE_MANAGER_ATTACH_VALIDATION_H_
