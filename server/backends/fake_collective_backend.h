// FakeCollectiveBackend: an in-process CollectiveBackendInterface for engine
// tests. FakeCollectiveBackend::CreateGroup(n) returns n backends (one per
// "node", each to be driven from its own thread) that meet in shared memory:
// no sockets, no store. Semantics follow the real backends:
//   - collectives are matched by call order; a node whose k-th call differs
//     (kind, count, dtype, root) fails everyone's k-th call (INVALID_ARGUMENT
//     naming both nodes), which is how the fake catches out-of-order buckets;
//   - sums are computed in node-rank order in the element type;
//   - a node that is destroyed or Leave()s makes the others' pending and later
//     calls fail with UNAVAILABLE naming it;
//   - a call not matched by every node within the timeout fails with
//     DEADLINE_EXCEEDED naming the nodes that did not arrive;
//   - after its first error a backend keeps returning that error.
// Also counts calls and bytes for assertions.
//
// Thread-safety: each backend from one thread; the group is internally
// synchronised.
#ifndef GRADD_SERVER_BACKENDS_FAKE_COLLECTIVE_BACKEND_H_
#define GRADD_SERVER_BACKENDS_FAKE_COLLECTIVE_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/dtype.h"
#include "server/backends/collective_backend.h"

namespace gradd {

class FakeCollectiveBackend final : public CollectiveBackendInterface {
 public:
  class Group;

  // `node_names` may be empty ("fake-node-<r>").
  static std::vector<std::unique_ptr<FakeCollectiveBackend>> CreateGroup(
      int num_nodes, absl::Duration timeout = absl::Seconds(10),
      std::vector<std::string> node_names = {});

  ~FakeCollectiveBackend() override;

  int node_rank() const override { return node_rank_; }
  int num_nodes() const override;
  [[nodiscard]] absl::Status AllreduceSum(void* data, size_t count,
                                          DType dtype) override;
  // The interface's default (local sum, AllreduceSum, write-back), counted.
  [[nodiscard]] absl::Status AllreduceAverage(
      const LocalAverage& work) override;
  [[nodiscard]] absl::Status Broadcast(void* data, size_t bytes,
                                       int root_node) override;
  // Folds the nodes' data in node-rank order with `combine`.
  [[nodiscard]] absl::Status AllreduceWith(void* data, size_t count,
                                           size_t elem_bytes,
                                           CombineFn combine) override;
  std::string NodeName(int node_rank) const override;

  // Simulates this node dying: the others' calls fail with UNAVAILABLE.
  void Leave();

  int64_t allreduce_calls() const { return allreduce_calls_; }
  int64_t broadcast_calls() const { return broadcast_calls_; }
  int64_t allreduce_with_calls() const { return with_calls_; }
  // Bytes handed to AllreduceSum so far, and each call's dtype in order.
  int64_t allreduce_bytes() const { return allreduce_bytes_; }
  const std::vector<DType>& allreduce_dtypes() const {
    return allreduce_dtypes_;
  }
  // AllreduceAverage calls, and those of them whose local buffers arrived
  // already summed (to_sum 1 with more than one buffer).
  int64_t average_calls() const { return average_calls_; }
  int64_t presummed_average_calls() const { return presummed_average_calls_; }

 private:
  FakeCollectiveBackend(std::shared_ptr<Group> group, int node_rank)
      : group_(std::move(group)), node_rank_(node_rank) {}

  absl::Status Run(int kind, void* data, size_t count, DType dtype, int root,
                   size_t elem = 0, CombineFn combine = nullptr);

  std::shared_ptr<Group> group_;
  const int node_rank_;
  uint64_t next_seq_ = 0;
  absl::Status broken_;
  int64_t allreduce_calls_ = 0;
  int64_t broadcast_calls_ = 0;
  int64_t with_calls_ = 0;
  int64_t allreduce_bytes_ = 0;
  std::vector<DType> allreduce_dtypes_;
  int64_t average_calls_ = 0;
  int64_t presummed_average_calls_ = 0;
};

}  // namespace gradd

#endif  // GRADD_SERVER_BACKENDS_FAKE_COLLECTIVE_BACKEND_H_
