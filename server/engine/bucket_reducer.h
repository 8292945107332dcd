// What a job's engine does with a bucket once every local rank has made it
// ready: the seam between the single-node fused path and the multi-node
// hierarchical path.
//
//   single node  FusedReducer: one pass, average across the local ranks
//                written back into every rank's bucket (FusedAverage), split
//                across the reduce pool; completes inside Start().
//   multi-node   (later) HierarchicalReducer: SumToAccumulator of the local
//                ranks into the bucket's accumulator on the engine thread,
//                then hands it to a network thread that issues
//                CollectiveBackendInterface::AllreduceSum in plan order (a
//                bucket that became ready early waits for its predecessors,
//                so every node issues the same sequence of collectives), then
//                ScatterFromAccumulator (divisor = global world size) and
//                completes from the network thread. The engine loop is the
//                same for both: it never starts a bucket again before its
//                completion for the previous iteration arrived.
#ifndef GRADD_SERVER_ENGINE_BUCKET_REDUCER_H_
#define GRADD_SERVER_ENGINE_BUCKET_REDUCER_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "common/dtype.h"
#include "common/thread_pool.h"

namespace gradd {

struct BucketWork {
  int bucket = 0;
  uint64_t iteration = 0;
  DType dtype = DType::kFloat32;
  size_t count = 0;  // elements
  // Bucket `bucket` in each local rank's memory, by local rank.
  const std::vector<void*>* rank_buffers = nullptr;
};

class BucketReducerInterface {
 public:
  // Called exactly once per Start, from any thread, when the result is in
  // every local rank's bucket (or the reduction failed).
  using Completion = absl::AnyInvocable<void(absl::Status) &&>;

  virtual ~BucketReducerInterface() = default;
  // Engine thread only. `work.rank_buffers` stays valid until completion.
  virtual void Start(const BucketWork& work, Completion done) = 0;
};

// The single-node path. Thread-compatible (one engine thread).
class FusedReducer final : public BucketReducerInterface {
 public:
  // `pool` (shared, may be null = inline) must outlive this reducer.
  // `divisor` is the number of ranks the average is over.
  FusedReducer(ThreadPool* pool, double divisor)
      : pool_(pool), divisor_(divisor) {}
  void Start(const BucketWork& work, Completion done) override;

 private:
  ThreadPool* const pool_;
  const double divisor_;
};

}  // namespace gradd

#endif  // GRADD_SERVER_ENGINE_BUCKET_REDUCER_H_
