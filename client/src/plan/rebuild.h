// Bucket rebuild, the client's side (the daemon's:
// server/engine/job/rebuild.h).
//
//   attach --MarkReady(i) x n (any threads)--> order of iteration k recorded
//     ^          WaitAll(): EndIteration() keeps it as last()      |
//     +------------------------------------------------------------+
//   RebuildBuckets(): RebuildBuckets RPC with last() (blocks until every
//     rank asked) -> new plan checked (plan_views.h) -> MoveToPlan
//     (plan_move.h) from the old places to the new ones -> new views;
//     recording stops.
//
// DDP records the order in its autograd hook (push_rebuilt_params) only
// for iterations that sync; gradd records what MarkReady sees, which is
// the same: no_sync() iterations do not mark parameters ready. DDP
// rebuilds from the first synced iteration (the second with static_graph),
// so only the first kRecordedIterations are recorded: a trainer that never
// rebuilds pays nothing after them.
//
// The old and new places share the rank's bucket memory and overlap, so
// MoveGradients (plan_move.h) goes through a staging copy of every gradient
// (transient memory = the gradients' size, as DDP allocates its new buckets
// before dropping the old ones). CUDA buckets: the new plan lies in the same
// device memory (the daemon sized it for any plan); their gradients move
// through a host snapshot by DeviceClient::MoveGradients, which waits for
// the GPU first (device_client.h), as torch's DDP rebuilds CUDA buckets
// exactly as CPU ones.
#ifndef GRADD_CLIENT_SRC_PLAN_REBUILD_H_
#define GRADD_CLIENT_SRC_PLAN_REBUILD_H_

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/src/plan/plan_views.h"
#include "gradd/v1/node.grpc.pb.h"

namespace gradd {

// Record() from any thread during an iteration; everything else from the
// thread that runs WaitAll / RebuildBuckets, between iterations.
class ReadyOrderRecorder {
 public:
  static constexpr int kRecordedIterations = 2;

  ReadyOrderRecorder(size_t num_params, bool enabled);

  // Call before the MarkReady's release of the bucket counter, so the
  // thread ending the iteration (which acquires the counters) sees it.
  void Record(int32_t param) {
    if (!enabled_.load(std::memory_order_relaxed)) return;
    const size_t at = next_.fetch_add(1, std::memory_order_relaxed);
    if (at < size_) order_[at].store(param, std::memory_order_relaxed);
  }
  // The iteration is complete: its order becomes last() if it names every
  // parameter once (it does when WaitAll succeeded).
  void EndIteration();
  const std::vector<int32_t>& last() const { return last_; }
  void Stop() { enabled_.store(false, std::memory_order_relaxed); }

 private:
  const size_t size_;
  // Atomic only so that a MarkReady racing a misused RebuildBuckets is not
  // undefined behaviour; the API orders them.
  std::atomic<bool> enabled_;
  std::unique_ptr<std::atomic<int32_t>[]> order_;
  std::atomic<size_t> next_{0};
  int iterations_ = 0;
  std::vector<int32_t> last_;
};

// One RebuildBuckets call: who asks, with what, and what the answer must fit.
struct RebuildCall {
  std::string job_id;
  int local_rank = 0;
  uint64_t session_id = 0;
  // The plan must take effect from here (the iteration after the one whose
  // order is sent).
  uint64_t next_iteration = 0;
  std::vector<int32_t> ready_order;
  std::chrono::milliseconds timeout{120000};
  std::string who;  // for messages
  // The registered parameters and the bucket region, as for MapPlanViews.
  const std::vector<std::string>* names = nullptr;
  const std::vector<int32_t>* dtypes = nullptr;
  const std::vector<size_t>* bytes = nullptr;
  char* base = nullptr;
  uint64_t region_bytes = 0;
  // CUDA buckets: this process's mapping of the rank's device memory.
  char* device_base = nullptr;
  uint64_t device_bytes = 0;
  // Set to the answer's next_switch_after (autotune) when not null.
  uint64_t* next_switch_after = nullptr;
};
// The RPC (blocks until every rank asked, bounded by `timeout`) and the
// checked new plan. Errors: the daemon's, prefixed with `who`; INTERNAL
// for a plan that does not fit.
absl::StatusOr<PlanViews> RequestRebuild(v1::Node::Stub& stub,
                                         const RebuildCall& call);

}  // namespace gradd

#endif  // GRADD_CLIENT_SRC_PLAN_REBUILD_H_
