// Communication hooks: the stage of a job's reduce pipeline between the
// local ranks' buckets and the network (DESIGN.md section 7). A hook takes
// the bucket of every local rank, talks to the other nodes only through the
// CollectiveBackendInterface it is handed (the backend moves the bytes the
// hook gives it) and leaves its result -- what torch's DDP leaves in the
// bucket after running the same hook -- in every local rank's bucket.
//
//   hook               wire between nodes           torch function
//   (none: allreduce)  the reducers' own path default_hooks.allreduce_hook
//   Compress16Hook     float16 / bfloat16 average   fp16_/bf16_compress_hook
//   PowerSgdHook       low-rank P and Q (float32) powerSGD_hook.powerSGD_hook,
//                                                   batched_powerSGD_hook
//
// "allreduce" needs no hook object: the reducers' default path is the
// average. Hooks are chosen per job (comm_hook_factory.h), all ranks and
// nodes agreeing; the single-node FusedReducer hands them a backend of one
// node (SingleNodeBackend below), the HierarchicalReducer its real one.
//
// Threads: Run is called from one thread at a time (the reducer's engine
// or network thread), for the buckets of a job in plan order, iteration by
// iteration -- so a hook may keep per-bucket state without locks, and every
// node issues the same collectives in the same order.
#ifndef GRADD_SERVER_HOOKS_COMM_HOOK_H_
#define GRADD_SERVER_HOOKS_COMM_HOOK_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/dtype.h"
#include "server/backends/collective_backend.h"

namespace gradd {

// One bucket of one iteration, as the hook sees it.
struct CommHookWork {
  int bucket = 0;
  uint64_t iteration = 0;  // from 1
  DType dtype = DType::kFloat32;
  size_t count = 0;  // elements
  // The bucket in every local rank's memory, by local rank.
  const std::vector<void*>* rank_buffers = nullptr;
};

class CommHookInterface {
 public:
  virtual ~CommHookInterface() = default;
  // Leaves the hook's result in every buffer of `work`. Errors: the
  // backend's (naming the peer node), INTERNAL / RESOURCE_EXHAUSTED for
  // memory. `net` spans the job's nodes; world size is the hook's own.
  [[nodiscard]] virtual absl::Status Run(const CommHookWork& work,
                                         CollectiveBackendInterface& net) = 0;
  // torch's name for it ("fp16_compress", "powerSGD", ...).
  virtual std::string name() const = 0;
};

// The network of a single-node job: one node, so every collective is the
// identity. Lets hooks run unchanged on one node.
class SingleNodeBackend final : public CollectiveBackendInterface {
 public:
  int node_rank() const override { return 0; }
  int num_nodes() const override { return 1; }
  [[nodiscard]] absl::Status AllreduceSum(void*, size_t, DType dtype) override {
    return CheckWireDType("AllreduceSum", dtype);
  }
  [[nodiscard]] absl::Status Broadcast(void*, size_t, int) override {
    return absl::OkStatus();
  }
  std::string NodeName(int) const override { return "this node"; }
};

}  // namespace gradd

#endif  // GRADD_SERVER_HOOKS_COMM_HOOK_H_
