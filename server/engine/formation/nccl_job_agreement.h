// The agreement a multi-node CUDA job needs before one NCCL communicator
// can span every GPU of the job on every node (docs/architecture.md, GPU
// data path): through the job's rendezvous store, each node publishes
// whether it can run NCCL and the UUIDs of its local GPUs (one NCCL rank
// per GPU); every node reads all of them and reaches the same decision:
//
//   NCCL   every node loaded NCCL and no GPU appears twice in the job:
//          node 0 draws the unique id (make_unique_id) and publishes it,
//          the others read it; node k's GPUs are NCCL ranks first_rank ..
//          first_rank + its GPU count - 1 (nodes in rank order), of `world`
//   staged otherwise, with the reason (the node without NCCL, or the GPU
//          two nodes share -- NCCL refuses two ranks on one GPU, e.g. two
//          daemons on one machine), so every node falls back to the host
//          staging path together.
//
// Keys: "<prefix>/nccl/node/<k>" ("nccl=<0|1>;gpus=<hex>,<hex>...") and
// "<prefix>/nccl/id" (hex), in the job's namespace. Blocking, bounded by
// `timeout` for the whole agreement; DEADLINE_EXCEEDED / UNAVAILABLE from
// the store name the node waited for. Any thread (it only talks to the
// store).
//
// Called by SetUpNcclJob (nccl_job_setup.h) on the formation thread;
// tested over the in-memory store (tests/unit/engine/
// formation/nccl_job_agreement_test.cc).
#ifndef GRADD_SERVER_ENGINE_FORMATION_NCCL_JOB_AGREEMENT_H_
#define GRADD_SERVER_ENGINE_FORMATION_NCCL_JOB_AGREEMENT_H_

#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/rendezvous/store_interface.h"

namespace gradd {

struct NcclNodeOffer {
  bool nccl = false;                   // libnccl.so.2 loaded on this node
  std::vector<std::string> gpu_uuids;  // 16 bytes each, in NCCL rank order
};

struct NcclJobAgreement {
  bool use_nccl = false;
  std::string why_not;    // when !use_nccl: names the node or GPU
  int world = 0;          // NCCL ranks in the job (every node's GPUs)
  int first_rank = 0;     // this node's first NCCL rank
  std::string unique_id;  // the ncclUniqueId's bytes, when use_nccl
};

struct NcclAgreementOptions {
  std::string job_id;
  std::string prefix;  // the formation round's (unique per round)
  int node_rank = 0;
  int num_nodes = 1;
  absl::Duration timeout = absl::Seconds(30);
};

absl::StatusOr<NcclJobAgreement> AgreeNcclJob(
    RendezvousStoreInterface& store, const NcclAgreementOptions& options,
    const NcclNodeOffer& mine,
    absl::FunctionRef<absl::StatusOr<std::string>()> make_unique_id);

}  // namespace gradd

#endif  // GRADD_SERVER_ENGINE_FORMATION_NCCL_JOB_AGREEMENT_H_
