// The inter-node collective engine one job's daemon uses: one participant per
// node. Implementations: backends/gloo (CPU, Gloo over TCP), later
// backends/nccl (GPU). A fake for engine tests lives beside them.
//
// Thread affinity: one job calls a backend from a single thread (its network
// thread), in the same order on every node. Every call is bounded by the
// backend's collective timeout and returns DEADLINE_EXCEEDED / UNAVAILABLE
// naming the peer node when a peer is gone; it never hangs.
#ifndef GRADD_SERVER_BACKENDS_COLLECTIVE_BACKEND_H_
#define GRADD_SERVER_BACKENDS_COLLECTIVE_BACKEND_H_

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/collective_reduce.h"
#include "common/dtype.h"

namespace gradd {

// One bucket of a node's local ranks, to be averaged over every rank of the
// job (see CollectiveBackendInterface::AllreduceAverage).
struct LocalAverage {
  // float32 or float64: the buckets are their own accumulator type.
  DType dtype = DType::kFloat32;
  // The node's local ranks' buckets, `count` elements each. buffers[0]
  // doubles as the node's accumulator.
  std::vector<void*> buffers;
  // How many leading buffers still need summing: buffers.size(), or 1 when
  // buffers[0] already holds the node's sum.
  int to_sum = 0;
  size_t count = 0;
  // The job's global world size.
  double divisor = 1;
  // What travels between the nodes: unset for `dtype` itself, or
  // float16/bfloat16 (dtype float32 only) for the 16-bit compression hooks. A
  // 16-bit wire carries each node's sum already divided by `divisor` and
  // rounded to 16 bits; the nodes' values are summed in 16 bits (each addition
  // in float32, rounded back, as AllreduceSum of a 16-bit buffer does) and the
  // result is converted back into every buffer.
  std::optional<DType> wire;
  DType wire_dtype() const { return wire.value_or(dtype); }
};

// OK for float32/float64; otherwise INVALID_ARGUMENT naming `op`.
absl::Status CheckAccumulatorDType(absl::string_view op, DType dtype);
// OK for what AllreduceSum carries: float32/float64, and float16/bfloat16
// (the 16-bit communication hooks' wire types, summed element by element
// in float32 and rounded back after each addition, as Gloo's float16 sum
// does); otherwise INVALID_ARGUMENT naming `op`.
absl::Status CheckWireDType(absl::string_view op, DType dtype);
// OK, or INVALID_ARGUMENT saying what is wrong with `work`.
absl::Status CheckLocalAverage(const LocalAverage& work);

class CollectiveBackendInterface {
 public:
  virtual ~CollectiveBackendInterface() = default;

  // This node's rank among the job's nodes, and their number.
  virtual int node_rank() const = 0;
  virtual int num_nodes() const = 0;

  // In-place element-wise sum of `count` elements across all nodes. dtype is
  // an accumulator type (float32 or float64) or a 16-bit wire type
  // (CheckWireDType).
  [[nodiscard]] virtual absl::Status AllreduceSum(void* data, size_t count,
                                                  DType dtype) = 0;
  // Leaves (sum over every rank of the job) / divisor in every buffer of
  // `work`, rounded as common/reduce.h states. The default sums the local
  // buffers into buffers[0], AllreduceSum()s it and writes back; a backend
  // may fuse the local sum and the write-back into its network schedule
  // (GlooBackend does for large buckets). Same call order rules as
  // AllreduceSum; every node must pass the same count and dtype.
  [[nodiscard]] virtual absl::Status AllreduceAverage(const LocalAverage& work);
  // True when AllreduceAverage fuses a 16-bit wire's compression into its
  // network schedule (GlooBackend, several nodes): callers that pipeline
  // the compression themselves (hooks/compress_hook.h) then hand the
  // whole bucket over instead.
  virtual bool FusesCompressedAverage() const { return false; }
  // In-place copy of `bytes` bytes from node `root_node` to every node.
  [[nodiscard]] virtual absl::Status Broadcast(void* data, size_t bytes,
                                               int root_node) = 0;
  // In-place element-wise reduction of `count` elements of `elem_bytes`
  // bytes each (1, 2, 4 or 8) across all nodes: every node ends with
  // combine(...combine(node 0, node 1)..., node n-1) in some association
  // order (exact for min/max and integer sums; float sums round like
  // AllreduceSum). Carries the collectives of arbitrary data
  // (common/collective_reduce.h); every node must pass the same count,
  // element size and combine function. The default: UNIMPLEMENTED.
  [[nodiscard]] virtual absl::Status AllreduceWith(void* data, size_t count,
                                                   size_t elem_bytes,
                                                   CombineFn combine);
  // Human-readable name of node `node_rank` for error messages.
  virtual std::string NodeName(int node_rank) const = 0;

 protected:
  // The default AllreduceAverage for a `work` that passed
  // CheckLocalAverage: local sum into buffers[0], AllreduceSum, write-back.
  [[nodiscard]] absl::Status AverageThroughAllreduceSum(
      const LocalAverage& work);
};

}  // namespace gradd

#endif  // GRADD_SERVER_BACKENDS_COLLECTIVE_BACKEND_H_
