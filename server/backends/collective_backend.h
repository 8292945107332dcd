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
#include <string>

#include "absl/status/status.h"
#include "common/dtype.h"

namespace gradd {

class CollectiveBackendInterface {
 public:
  virtual ~CollectiveBackendInterface() = default;

  // This node's rank among the job's nodes, and their number.
  virtual int node_rank() const = 0;
  virtual int num_nodes() const = 0;

  // In-place element-wise sum of `count` elements across all nodes. dtype is
  // an accumulator type (float32 or float64).
  [[nodiscard]] virtual absl::Status AllreduceSum(void* data, size_t count,
                                                  DType dtype) = 0;
  // In-place copy of `bytes` bytes from node `root_node` to every node.
  [[nodiscard]] virtual absl::Status Broadcast(void* data, size_t bytes,
                                               int root_node) = 0;
  // Human-readable name of node `node_rank` for error messages.
  virtual std::string NodeName(int node_rank) const = 0;
};

}  // namespace gradd

#endif  // GRADD_SERVER_BACKENDS_COLLECTIVE_BACKEND_H_
