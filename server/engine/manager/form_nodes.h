// FormNodes: the body of a multi-node job's formation thread
// (JobManager::StartNodeFormation, job_manager_formation.cc): finds the
// job's rendezvous coordinator and the address the other nodes reach this
// one on, then either asks to be admitted into the job where it already
// runs re-formably without this node (formation/reformation.h), or opens a
// formation round and forms the job with the other nodes
// (formation/node_formation.h); NCCL between the nodes for CUDA jobs.
//
// Blocking, bounded by the formation timeout (and `limit`); touches no
// JobManager state, so it runs on a thread of its own that posts the
// result back to the control thread.
#ifndef GRADD_SERVER_ENGINE_MANAGER_FORM_NODES_H_
#define GRADD_SERVER_ENGINE_MANAGER_FORM_NODES_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/engine/formation/nccl_job_setup.h"
#include "server/engine/formation/node_formation.h"
#include "server/rendezvous/coordinator.h"
#include "server/rendezvous/store_interface.h"

namespace gradd {

// A node admitted into its running re-formable job (FindRunning found
// it): what the agreement said besides the layout.
struct NodeAdmission {
  uint64_t epoch = 0;
  uint64_t sync_seq = 0;
  bool behind = false;
  std::string store_prefix;
  std::string reformation_prefix;
  int64_t arrivals_seen = 0;
  int max_nodes = 1;
  // The job's initial world size (Reformed::initial_world_size; 0: the
  // closer did not know it).
  int initial_world_size = 0;
  // The job's nodes lost and not back (Reformed::departed).
  std::vector<std::string> lost;
  // Where its iterations start (JobSpec::first_iteration).
  uint64_t first_iteration = 1;
};

// What a formation thread hands back: the backend and the store it uses.
struct FormedNodes {
  NodeFormation formation;
  std::unique_ptr<RendezvousStoreInterface> store;
  std::string coordinator;
  std::string round_prefix;
  // CUDA jobs on real GPUs: NCCL between the nodes, or why not.
  std::shared_ptr<NcclJobSetup> nccl;
  // Set when this node was admitted into its running re-formable job.
  std::optional<NodeAdmission> admission;
  // Re-formable jobs: clients that hold the job's formation round and
  // re-formation namespace in the store while it runs here
  // (RendezvousStoreInterface::ReleaseRoundWhenDone).
  std::vector<std::unique_ptr<RendezvousStoreInterface>> releases;
};

struct FormNodesRequest {
  // The formation (job id, this node, the nodes, timeouts, re-formable or
  // not); its advertise_host and prefix are filled in here.
  NodeFormationOptions options;
  // The coordinator the ranks asked for (empty: the daemon's).
  std::string coordinator;
  std::shared_ptr<CoordinatorSelector> selector;
  // rendezvous.advertise_host and rendezvous.interface.
  std::string advertise_host;
  std::string interface;
  // The job's min_nodes (0: none) and its ranks' GPUs.
  int min_nodes = 0;
  std::vector<int> rank_devices;
  // NCCL between the nodes (null: none, the job is not on GPUs).
  NcclJobPlatformInterface* nccl = nullptr;
  // rendezvous.reformation_settle_ms, for an admission.
  absl::Duration settle = absl::ZeroDuration();
  // When NCCL's set-up must be done.
  absl::Time limit = absl::InfiniteFuture();
};

// Errors: those of the rendezvous, the formation or the admission, with the
// job's id; UNAVAILABLE when the coordinator cannot be found or reached.
absl::StatusOr<FormedNodes> FormNodes(FormNodesRequest request);

}  // namespace gradd

#endif  // GRADD_SERVER_ENGINE_MANAGER_FORM_NODES_H_
