// What a job's engine does with a bucket once every local rank has made it
// ready: the seam between the single-node fused path and the multi-node
// hierarchical path.
//
//   single node  FusedReducer: one pass, average across the local ranks
//                written back into every rank's bucket (FusedAverage), split
//                across the reduce pool; completes inside Start().
//   multi-node   HierarchicalReducer (hierarchical_reducer.h): SumToAccumulator
//   of the local
//                ranks into the bucket's accumulator on the engine thread,
//                then hands it to a network thread that issues
//                CollectiveBackendInterface::AllreduceSum in an order
//                every node agrees on (plan order, or with priority
//                scheduling the first layers first among the buckets ready
//                on every node), so every node issues the same sequence of
//                collectives, then
//                ScatterFromAccumulator (divisor = global world size) and
//                completes from the network thread. The engine loop is the
//                same for both: it never starts a bucket again before its
//                completion for the previous iteration arrived.
#ifndef GRADD_SERVER_ENGINE_REDUCE_BUCKET_REDUCER_H_
#define GRADD_SERVER_ENGINE_REDUCE_BUCKET_REDUCER_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "common/collective_reduce.h"
#include "common/control_block.h"
#include "common/device.h"
#include "common/dtype.h"
#include "common/thread_pool.h"
#include "gradd/v1/node.pb.h"
#include "server/engine/observe/job_events.h"
#include "server/hooks/comm_hook.h"

namespace gradd {

// Time spent per phase, cumulative over a reducer's life (nanoseconds), for
// stats and the benchmark's split. The fused path counts everything as
// local reduce.
struct ReducerStats {
  uint64_t buckets = 0;
  uint64_t local_reduce_ns = 0;
  uint64_t network_ns = 0;
  uint64_t write_back_ns = 0;
  // Priority scheduling (hierarchical_reducer.h): the small allreduces
  // through which the nodes agreed on which buckets were ready, and the
  // buckets that went to the network before a bucket earlier in plan order.
  uint64_t negotiations = 0;
  uint64_t out_of_order_buckets = 0;
};

struct BucketWork {
  int bucket = 0;
  uint64_t iteration = 0;
  DType dtype = DType::kFloat32;
  size_t count = 0;  // elements
  // Only gradd's own parameters (Bucket::internal): never through a hook.
  bool internal = false;
  // Scheduling priority, lower first: the smallest parameter index the
  // bucket holds (parameters are registered in module order, roughly the
  // order the next forward uses them). The same on every node.
  int64_t priority = 0;
  // kCuda: rank_buffers are device addresses in the daemon's mapping of
  // each rank's device memory; only a device-capable reducer
  // (device_reducer.h) touches them.
  DeviceKind device = DeviceKind::kCpu;
  // Bucket `bucket` in the memory of each local rank that contributes (all
  // of them, except ranks that joined: join_state.h); may be empty (a node
  // whose ranks all joined contributes zeros to the network collective).
  // Only these buffers are written.
  const std::vector<void*>* rank_buffers = nullptr;
  // The local rank of each entry of rank_buffers (join mode, where only the
  // active ranks contribute); null: entry k is local rank k's. A device
  // reducer needs it to wait on the right ranks' events.
  const std::vector<int>* ranks = nullptr;
  // What the sum is divided by; 0: the reducer's own (the world size).
  // Join mode sets it per iteration (initial world size or active ranks).
  double divisor = 0;
  // Where the reducer records when each phase of this bucket ran (may be
  // null); the engine reads it in the completion, and does not touch it
  // before.
  BucketTiming* timing = nullptr;
};

// One daemon-mediated collective round (common/control_block.h): by
// default a broadcast of `bytes` bytes from global rank `root`'s area into
// every other rank's area; `kind` selects the other collectives
// (area_collective.h says what each does with the areas).
struct BroadcastWork {
  uint64_t seq = 0;
  int root = 0;  // global rank, already checked to be in range
  size_t bytes = 0;
  // Each local rank's broadcast area, by local rank; nullptr for a rank that
  // takes no part (joined ranks, join_state.h). A node none of whose ranks
  // take part passes one scratch area (it only relays, never the root).
  // Collectives other than broadcast never run in join mode: every entry
  // is set.
  const std::vector<void*>* rank_areas = nullptr;
  CollectiveKind kind = CollectiveKind::kBroadcast;
  // allreduce / reduce_scatter only, already validated (CheckReduction).
  CollectiveDType dtype = CollectiveDType::kUInt8;
  CollectiveOp op = CollectiveOp::kSum;
  // The global rank of local rank 0 and the job's world size (allgather's
  // block positions, avg's divisor).
  int first_rank = 0;
  int world_size = 1;
};

// One join round (join_state.h): `values` summed element-wise across nodes.
struct JoinRoundWork {
  uint64_t iteration = 0;
  std::vector<double> values;
};

class BucketReducerInterface {
 public:
  // Called exactly once per Start, from any thread, when the result is in
  // every local rank's bucket (or the reduction failed).
  using Completion = absl::AnyInvocable<void(absl::Status) &&>;

  virtual ~BucketReducerInterface() = default;
  // Engine thread only. `work.rank_buffers` stays valid until completion.
  virtual void Start(const BucketWork& work, Completion done) = 0;
  // Engine thread only. Called only while no bucket is with the reducer
  // for a later iteration than the ones already started (the client API
  // blocks a rank in Broadcast, so its buckets cannot run ahead of it).
  // `work.rank_areas` stays valid until completion. The default is the
  // single-node copy (global rank == local rank), completing inline; for
  // the other collective kinds the single-node RunLocalAreaCollective
  // (area_collective.h).
  virtual void StartBroadcast(const BroadcastWork& work, Completion done);
  // Engine thread only. Called before any bucket of `work.iteration` is
  // started, and only while no bucket is with the reducer. The result goes
  // to the network in plan order, before bucket 0 of that iteration. The
  // default (single node) completes inline with the values unchanged.
  using RoundCompletion =
      absl::AnyInvocable<void(absl::Status, std::vector<double>) &&>;
  virtual void StartJoinRound(JoinRoundWork work, RoundCompletion done);
  // Any thread.
  virtual ReducerStats stats() const { return {}; }
  // Engine thread only, while no bucket is with the reducer: from iteration
  // `first_iteration` on the job has `num_buckets` buckets (a bucket
  // rebuild, job.h); per-bucket state of the old plan is dropped.
  virtual void Replan(uint64_t first_iteration, int num_buckets) {}
  // Engine thread only, before any bucket of `first_iteration` is started
  // (buckets of earlier iterations may still be with the reducer): from
  // that iteration on, buckets go to the network in partitions of `bytes`
  // (0: whole buckets), the unit priority scheduling picks
  // (hierarchical_reducer.h). Every node of the job must make the same call
  // for the same iteration (the partition is part of the sequence of
  // collectives). Reducers that do not partition ignore it.
  virtual void SetPartitionBytes(uint64_t first_iteration, size_t bytes) {}
  // Engine thread only, before the reducer's first Start: the first
  // iteration it will be given (1 for a new job; the reducer of a re-formed
  // multi-node job starts after the aborted iteration, job.h). Reducers
  // that do not order buckets by iteration ignore it.
  virtual void StartAt(uint64_t first_iteration) {}

  // Engine thread only, before the first Start: every bucket from now on
  // goes through `hook` (server/hooks/) instead of the plain average; null
  // keeps the average. UNIMPLEMENTED where the reducer runs no hooks.
  [[nodiscard]] virtual absl::Status SetCommHook(
      std::unique_ptr<CommHookInterface> hook) {
    return hook == nullptr ? absl::OkStatus()
                           : absl::UnimplementedError(
                                 "this reducer runs no communication hooks");
  }
  // Engine thread only, before the first Start: OK when every node of the
  // job chose the hook `description` (DescribeCommHook); INVALID_ARGUMENT
  // naming two nodes that differ. Blocks, bounded. Single node: OK.
  [[nodiscard]] virtual absl::Status AgreeCommHook(
      const std::string& description) {
    return absl::OkStatus();
  }
  // Before the Attach replies: what local rank `rank` needs to take part in
  // device buckets (the interprocess events of device_reducer.h). Host
  // reducers add nothing.
  virtual void DescribeDevice(int rank, v1::AttachResponse* response) const {}
};

// The single-node path. Thread-compatible (one engine thread).
class FusedReducer final : public BucketReducerInterface {
 public:
  // `pool` (shared, may be null = inline) must outlive this reducer.
  // `divisor` is the number of ranks the average is over.
  FusedReducer(ThreadPool* pool, double divisor)
      : pool_(pool), divisor_(divisor) {}
  void Start(const BucketWork& work, Completion done) override;
  ReducerStats stats() const override;
  [[nodiscard]] absl::Status SetCommHook(
      std::unique_ptr<CommHookInterface> hook) override {
    hook_ = std::move(hook);
    return absl::OkStatus();
  }

 private:
  ThreadPool* const pool_;
  const double divisor_;
  std::unique_ptr<CommHookInterface> hook_;
  SingleNodeBackend single_node_;
  // Written by the engine thread, read by stats() from any thread.
  std::atomic<uint64_t> buckets_{0};
  std::atomic<uint64_t> reduce_ns_{0};
};

}  // namespace gradd

#endif  // GRADD_SERVER_ENGINE_REDUCE_BUCKET_REDUCER_H_
