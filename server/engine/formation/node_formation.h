// The multi-node half of forming a job, run by the JobManager off its
// control thread once the node's local ranks have all attached and agree:
//
//   1. FormJob through the rendezvous store (rendezvous/job_formation.h):
//      node ranks, global rank offsets, world size, fingerprint check
//      (a mismatch names the parameter and both nodes; a node that never
//      arrives fails everyone after the formation timeout, listing the missing
//      node ids when they are configured);
//   2. the bucket plan: node rank 0 publishes its plan under
//      "<prefix>/plan", every other node adopts it after checking that it
//      is a valid plan for its own parameters (node rank 0's plan wins, as
//      in DDP, so a node with other bucket caps still issues the same
//      collectives);
//   3. the inter-node backend (GlooBackend) under "<prefix>/gloo".
//
// Keys live in the job's namespace of the store under `prefix`, which must
// be the same on every node and fresh for every formation round of a job:
// OpenRound picks it. Rounds are numbered from 1; a node joins the first
// round not yet closed, and every node closes its round once FormNodeJob
// returned (formed or failed), so nodes that try again after a failure, or
// re-form a job whose trainers restarted, meet in the next round.
//
// Thread-safety: a plain function; blocks the calling thread up to about
// `formation_timeout` (steps 1-3 share one deadline).
#ifndef GRADD_SERVER_ENGINE_FORMATION_NODE_FORMATION_H_
#define GRADD_SERVER_ENGINE_FORMATION_NODE_FORMATION_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/bucket_planner.h"
#include "gradd/v1/node.pb.h"
#include "server/backends/collective_backend.h"
#include "server/rendezvous/job_formation.h"
#include "server/rendezvous/store_interface.h"

namespace gradd {

struct NodeFormationOptions {
  std::string job_id;
  std::string node_id;
  std::optional<int> node_rank;
  int num_nodes = 1;
  int local_world_size = 1;
  // This node's model (the fingerprint) and its own bucket plan.
  std::vector<ParamInfo> params;
  BucketPlan local_plan;
  // Host the other nodes reach this node's Gloo transport on.
  std::string advertise_host = "127.0.0.1";
  absl::Duration formation_timeout = absl::Seconds(60);
  absl::Duration collective_timeout = absl::Seconds(30);
  // An elastic job (reformation.h): its Gloo backend runs no failure probe
  // (GlooBackend::Options::failure_probe_timeout 0), because the
  // re-formation that follows a failure finds the lost nodes itself, and
  // the probe would wait its whole timeout for exactly those nodes first.
  bool elastic = false;
  std::vector<std::string> expected_node_ids;
  std::string prefix = "formation";
};

struct NodeFormation {
  JobLayout layout;
  // The job's plan (node rank 0's).
  BucketPlan plan;
  std::unique_ptr<CollectiveBackendInterface> backend;
};

// `store` must outlive the returned backend (it reports failures through
// it). Errors as FormJob's and GlooBackend::Create's, prefixed with the job;
// FAILED_PRECONDITION when node rank 0's plan does not fit this node's
// parameters.
[[nodiscard]] absl::StatusOr<NodeFormation> FormNodeJob(
    RendezvousStoreInterface& store, const NodeFormationOptions& options);

// "round<k>" for the first round k of `job_id` without a closed mark.
[[nodiscard]] absl::StatusOr<std::string> OpenRound(
    RendezvousStoreInterface& store, const std::string& job_id);
// Marks round `prefix` closed (`why`: for people reading the store). Best
// effort: a node that cannot reach the store now cannot form anyway.
void CloseRound(RendezvousStoreInterface& store, const std::string& job_id,
                const std::string& prefix, const std::string& why);

// The plan as bytes (a v1::AttachResponse carrying only buckets and
// rank_memory_bytes), and back. ParsePlan checks the plan against `params`:
// every parameter exactly once, in a bucket of its dtype, inside the
// bucket, buckets aligned, disjoint and inside a total no larger than the
// parameters need; INVALID_ARGUMENT naming what is wrong otherwise.
std::string SerializePlan(const BucketPlan& plan);
absl::StatusOr<BucketPlan> ParsePlan(const std::string& bytes,
                                     const std::vector<ParamInfo>& params);

// FormJob's fingerprint form of `params`.
std::vector<v1::ParamSpec> Fingerprint(const std::vector<ParamInfo>& params);

}  // namespace gradd

#endif  // GRADD_SERVER_ENGINE_FORMATION_NODE_FORMATION_H_
