// FormJob: one node daemon's side of forming a multi-node job through the
// rendezvous store. Every node of the job calls it with the same job id,
// node count and prefix; all of them get the same JobLayout, or all of them
// get the same error.
//
// Protocol (keys under "<prefix>/" in the job's namespace):
//   member/<node_id>  this node's JobMember (node id, requested node rank,
//                     local world size, node count, model fingerprint)
//   joined            counter; Add(1) hands out this node's arrival slot
//   slot/<i>          node id of the i-th arrival, i in [0, num_nodes)
// then Wait(slot/0..num_nodes-1) and read everything back.
//
// Node ranks are deterministic and independent of arrival order: nodes with
// an explicit node rank get it; the remaining ranks go, in increasing order,
// to the remaining nodes sorted by node id. Global rank offset of node k =
// sum of the local world sizes of node ranks < k (local world sizes may
// differ). Node rank 0's fingerprint is the reference: the first node (in
// node-rank order) whose fingerprint differs fails the job with an error
// naming the first differing parameter and both node ids.
//
// Use a prefix unique to this formation round (e.g. with a generation
// number) when a job re-forms. The store groups a round's keys by their
// first '/'-separated segment (kv_store.h): node_formation.h's prefixes
// are "round<k>/members".
//
// Membership: with expected_node_ids set, a node whose own id is not listed
// does not join, and a formation that some unlisted node joined fails
// naming it; the coordinator refuses such nodes before they take a slot
// (RendezvousService, FormationNodeIdOf). Only daemons holding the
// cluster's credentials reach the store at all (server/auth/).
//
// Errors: INVALID_ARGUMENT (bad options, conflicting explicit ranks),
// FAILED_PRECONDITION (fingerprint or node-count mismatch, too many nodes, a
// node not in expected_node_ids), PERMISSION_DENIED (the coordinator
// refused this node), UNAUTHENTICATED (it refused this daemon's credentials),
// DEADLINE_EXCEEDED (nodes missing after `timeout`; names them when it can),
// UNAVAILABLE (the coordinator is unreachable).
//
// Thread-safety: a plain function; blocks the calling thread up to `timeout`.
#ifndef GRADD_SERVER_RENDEZVOUS_JOB_FORMATION_H_
#define GRADD_SERVER_RENDEZVOUS_JOB_FORMATION_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "gradd/v1/node.pb.h"
#include "server/rendezvous/store_interface.h"

namespace gradd {

struct JobFormationOptions {
  std::string job_id;
  std::string node_id;
  // Explicit node rank; wins over the automatic assignment.
  std::optional<int> node_rank;
  int num_nodes = 1;
  int local_world_size = 1;
  // The model fingerprint: parameter names, shapes and dtypes, in order.
  std::vector<v1::ParamSpec> params;
  // How long to wait for every node to join.
  absl::Duration timeout = absl::Seconds(60);
  // Optional: the node ids allowed to form jobs (rendezvous.expected_node_
  // ids); a timeout names the missing ones.
  std::vector<std::string> expected_node_ids;
  std::string prefix = "formation";
};

struct JobNode {
  std::string node_id;
  int node_rank = 0;
  int local_world_size = 0;
  int global_rank_offset = 0;
};

struct JobLayout {
  // This node.
  int node_rank = 0;
  int global_rank_offset = 0;
  int num_nodes = 0;
  // Sum of every node's local world size.
  int world_size = 0;
  // Indexed by node rank.
  std::vector<JobNode> nodes;

  std::vector<std::string> NodeIds() const;
};

[[nodiscard]] absl::StatusOr<JobLayout> FormJob(
    RendezvousStoreInterface& store, const JobFormationOptions& options);

// The node a formation key speaks for: "<prefix>/member/<id>" names <id>
// (the first "/member/" ends the prefix), "<prefix>/slot/<i>" holds a node
// id as its value; nullopt for any other key. The coordinator checks these
// against rendezvous.expected_node_ids.
std::optional<std::string> FormationNodeIdOf(absl::string_view key,
                                             absl::string_view value);

// The first difference between two fingerprints, or nullopt when equal.
// `a_node`/`b_node` name their owners in the message.
std::optional<std::string> DescribeFingerprintMismatch(
    const std::vector<v1::ParamSpec>& a, const std::string& a_node,
    const std::vector<v1::ParamSpec>& b, const std::string& b_node);

}  // namespace gradd

#endif  // GRADD_SERVER_RENDEZVOUS_JOB_FORMATION_H_
