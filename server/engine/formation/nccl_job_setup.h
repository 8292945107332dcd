// NCCL between the nodes of a multi-node CUDA job, set up while the job
// forms (JobManager's formation thread, never its control thread): one
// communicator spanning every GPU of the job on every node, each daemon
// driving its local GPUs as ranks inside group calls.
//
//   1. AgreeNcclJob (nccl_job_agreement.h): every node publishes whether
//      it can run NCCL and its GPUs; all reach the same decision, node 0's
//      unique id travels through the store;
//   2. NCCL agreed: Connect (ncclCommInitRank per local GPU in one group
//      call, non-blocking, aborted when `timeout` passes);
//   3. a second store round, because step 2 can fail on one node only
//      (a peer's transport, an out-of-memory GPU, one node's timeout):
//      every node publishes "ok" or its error under
//      "<prefix>/nccl/init/<k>" and reads every other node's; NCCL only
//      when every node connected, otherwise every node aborts its
//      communicators and the job's CUDA buckets are staged through host
//      memory (Gloo), with the failing node's error as the reason.
//
// So every node takes the same path: the agreement's decision, then the
// result of round 3. A node that cannot reach the store in steps 1 or 3
// returns the store's error and its job fails; the others then fail too
// (they time out waiting for it), rather than one node reducing with NCCL
// while another stages. Each step is bounded by `timeout`.
//
// An elastic job (reformation.h) connects a fresh communicator the same
// way after every re-formation: the new epoch's nodes, in their new node
// ranks, agree under the epoch's prefix ("<elastic>/epoch<e>"), so NCCL
// ranks and the world follow the live membership and no key of an older
// group is read. The communicator of the previous group is never reused:
// after a node loss the CUDA reducer's watchdog has already aborted it
// (ncclCommAbort is how a collective stuck on the dead peer ends), which
// also rules out ncclCommShrink (NCCL 2.27+), whose parent must be a
// communicator that was not aborted; an arrival needs a larger group,
// which only a new communicator gives. One path for loss, arrival and
// rank restart, tested over the store with fake platforms.
//
// Blocking; any thread. The platform (NCCL and the GPUs) is an interface:
// CudaNcclJobPlatform (cuda/nccl_job_platform.h) on real GPUs, fakes in
// tests (tests/unit/engine/formation/nccl_job_setup_test.cc).
#ifndef GRADD_SERVER_ENGINE_FORMATION_NCCL_JOB_SETUP_H_
#define GRADD_SERVER_ENGINE_FORMATION_NCCL_JOB_SETUP_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/engine/formation/nccl_job_agreement.h"
#include "server/rendezvous/job_formation.h"
#include "server/rendezvous/store_interface.h"

namespace gradd {

// The communicators a node connected (one per local GPU, NCCL ranks
// first_rank ..); the device reducer downcasts to the platform's type.
class NcclJobCommsInterface {
 public:
  virtual ~NcclJobCommsInterface() = default;
  // ncclCommAbort on every communicator; any thread.
  virtual void Abort() = 0;
};

class NcclJobPlatformInterface {
 public:
  virtual ~NcclJobPlatformInterface() = default;
  // This node's offer for its GPUs (daemon ordinals, in NCCL rank order):
  // nccl false, with `why_not` set, when it cannot take part.
  virtual NcclNodeOffer Offer(const std::vector<int>& gpus,
                              std::string* why_not) = 0;
  // A fresh ncclUniqueId's bytes (node rank 0).
  virtual absl::StatusOr<std::string> MakeUniqueId() = 0;
  // NCCL ranks first_rank .. first_rank + gpus.size() - 1 of `world`;
  // DEADLINE_EXCEEDED (communicators aborted) when `timeout` passes.
  virtual absl::StatusOr<std::unique_ptr<NcclJobCommsInterface>> Connect(
      const std::string& unique_id, int world, int first_rank,
      const std::vector<int>& gpus, absl::Duration timeout,
      const std::string& context) = 0;
};

struct NcclJobSetup {
  // Null: the job's CUDA buckets are staged, because of `staged_because`.
  std::unique_ptr<NcclJobCommsInterface> comms;
  std::string staged_because;
  int world = 0;       // NCCL ranks of the job
  int first_rank = 0;  // this node's first
};

struct NcclJobSetupOptions {
  std::string job_id;
  std::string prefix;  // the formation round's
  int node_rank = 0;
  int num_nodes = 1;
  absl::Duration timeout = absl::Seconds(30);  // per step
};

// The distinct GPUs of `rank_devices` in order of first appearance: the
// node's NCCL ranks, in the order the device reducer groups its ranks.
std::vector<int> JobGpus(const std::vector<int>& rank_devices);

[[nodiscard]] absl::StatusOr<NcclJobSetup> SetUpNcclJob(
    RendezvousStoreInterface& store, const NcclJobSetupOptions& options,
    NcclJobPlatformInterface& platform, const std::vector<int>& gpus);

// The formation thread's call: SetUpNcclJob for the GPUs of `rank_devices`,
// each step bounded by `collective_timeout` and all three by `limit` (the
// ranks' Attach deadline, less a margin); logs the outcome (the reason
// when staged). DEADLINE_EXCEEDED when no time is left.
[[nodiscard]] absl::StatusOr<std::shared_ptr<NcclJobSetup>>
SetUpNcclBetweenNodes(RendezvousStoreInterface& store,
                      NcclJobPlatformInterface& platform,
                      NcclJobSetupOptions options,
                      const std::vector<int>& rank_devices, absl::Time limit);

// SetUpNcclBetweenNodes for the group `layout` (its node rank and node
// count) agreed under `prefix`: the formation round's, or after a
// re-formation the epoch's (Reformed::store_prefix). Each step is bounded
// by `collective_timeout`.
[[nodiscard]] absl::StatusOr<std::shared_ptr<NcclJobSetup>> SetUpNcclForGroup(
    RendezvousStoreInterface& store, NcclJobPlatformInterface& platform,
    const std::string& job_id, const std::string& prefix,
    const JobLayout& layout, absl::Duration collective_timeout,
    const std::vector<int>& rank_devices, absl::Time limit);

// Every key SetUpNcclJob (and its agreement) may write under `prefix` for
// a group of `num_nodes` nodes: what the closer of a later epoch deletes
// (reformation.h).
std::vector<std::string> NcclJobSetupKeys(const std::string& prefix,
                                          int num_nodes);

// The daemon's platform for SetUpNcclBetweenNodes: the process's NCCL and
// CUDA driver (CudaNcclJobPlatform) on real GPUs, null in a daemon built
// without CUDA. Process-wide, never freed; any thread.
NcclJobPlatformInterface* DaemonNcclJobPlatform();

}  // namespace gradd

#endif  // GRADD_SERVER_ENGINE_FORMATION_NCCL_JOB_SETUP_H_
