// Bucket rebuild, the daemon's side: DDP's Reducer::rebuild_buckets. After
// an iteration (torch: at the start of the second DDP forward, the third
// with static_graph) every trainer asks to re-plan its buckets from the
// order its gradients actually became ready in; every rank of the job must
// switch to the same plan at the same iteration boundary, and every node
// must, because the plan's order is the order of the job's collectives.
//
// One RebuildCoordinator per active job, owned by the JobManager, used once:
//
//   idle --first RebuildBuckets(k)--> collecting ----every local rank asked,
//    |       job.ExpectRebuild(k)       |  same k, order valid---> agreeing
//    |                                  |                             |
//    |     deadline / rank gone /       |     multi-node: node rank 0's
//    |     ranks disagree on k /        v     order and caps through the
//    |     bad order / job failed --> failed  rendezvous store; single
//    |        (job error published,     ^     node: local rank 0's
//    |         every waiting rank       |                             |
//    |         answered with it)        +-----------------+  timeout  v
//    |                                                    +--------- switching
//    v                                                      job.SwitchPlan(k)
//   (a second rebuild: FAILED_PRECONDITION,   rebuilt <--- engine at the
//    but for autotune's switches)        (every rank answered   boundary
//                                         with the new plan)
//
// Autotune (bucket_autotune.h; the job has an AutotuneRecord): the rebuild
// is the first trial's switch, and its answer names the iteration after
// which every rank asks again (next_switch_after); each later round runs
// the same way (collecting, agreeing, switching) from the rebuilt order
// with the next trial's cap, until the answer names none (settled). Node
// rank 0 decides the caps and the schedule and they travel in its
// RebuildOrder, under "<round>/tune<n>/rebuild/" for round n > 0.
//
// Local rank 0's order is the job's (torch broadcasts rank 0's rebuilt
// bucket indices, so every rank agrees); the others' orders are checked
// for size only. The plan is PlanBucketsInOrder over the job's caps (node
// rank 0's caps, multi-node: its plan won at formation too).
//
// Multi-node agreement (AgreeOnRebuild), keys under "<round>/rebuild/" of
// the job's namespace (round: the formation round, so a re-formed job
// starts afresh):
//   order          node rank 0's RebuildOrder (iteration, caps, order)
//   ack/<node>     every node, after planning from `order`: its plan's
//                  fingerprint
// then every node waits for every ack and checks they all match; a node
// whose ranks never ask fails everyone at the timeout, named. Nobody
// switches before every node has acknowledged, so either all nodes switch
// or all fail.
//
// Threads: Add / RankGone / the destructor on the JobManager's control
// thread. The work (waiting for the other ranks, the store exchange, the
// engine switch) runs on a thread of the coordinator's own, started by
// the first Add; callbacks run there. Every wait is bounded (the ranks'
// deadlines, the daemon's attach timeout, the rendezvous formation timeout) and
// re-checks cancellation and the job's failure every 100 ms. The
// destructor cancels and joins.
#ifndef GRADD_SERVER_ENGINE_JOB_REBUILD_H_
#define GRADD_SERVER_ENGINE_JOB_REBUILD_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/bucket_planner.h"
#include "gradd/v1/config.pb.h"
#include "gradd/v1/node.pb.h"
#include "gradd/v1/rendezvous.pb.h"
#include "server/engine/job/job.h"
#include "server/rendezvous/coordinator.h"
#include "server/rendezvous/store_interface.h"

namespace gradd {

struct RebuildOptions {
  // Longest wait for the other local ranks after the first one asked.
  absl::Duration local_timeout = absl::Seconds(60);
  // Multi-node: longest wait for the other nodes; how to reach the store.
  absl::Duration node_timeout = absl::Seconds(60);
  // Longest wait for the engine to reach the iteration boundary (it is
  // there already when every rank waited for its iteration).
  absl::Duration switch_timeout = absl::Seconds(30);
  std::string round_prefix;
  using StoreFactory = std::function<
      absl::StatusOr<std::unique_ptr<RendezvousStoreInterface>>()>;
  StoreFactory store_factory;  // null: single node
};

class RebuildCoordinator {
 public:
  using Callback =
      absl::AnyInvocable<void(absl::StatusOr<v1::RebuildBucketsResponse>) &&>;

  // `job` must outlive this object.
  RebuildCoordinator(Job* job, RebuildOptions options);
  ~RebuildCoordinator();

  RebuildCoordinator(const RebuildCoordinator&) = delete;
  RebuildCoordinator& operator=(const RebuildCoordinator&) = delete;

  // Local rank `request.local_rank()` (checked by the caller) asks; `done`
  // is answered by `deadline` at the latest. Control thread.
  void Add(v1::RebuildBucketsRequest request, absl::Time deadline,
           Callback done);
  // Local rank `rank` left: a rebuild in progress, or asked for later,
  // fails. Control thread.
  void RankGone(int rank);

  bool rebuilt() const;
  // Some local rank asked and the rebuild has not finished. Any thread.
  bool in_progress() const;
  // What the admin API shows: whether the rebuild ran well, after which
  // iteration, and the parameter ready order its plan came from (node rank
  // 0's local rank 0). Any thread.
  struct Record {
    bool rebuilt = false;
    uint64_t iteration = 0;
    std::vector<int32_t> ready_order;
  };
  Record record() const;

 private:
  struct Waiting {
    v1::RebuildBucketsRequest request;
    absl::Time deadline;
    Callback done;
  };
  // The plan and what the ranks are told besides.
  struct Decision {
    BucketPlan plan;
    uint64_t next_switch_after = 0;
    // Autotune's switch, for the job's events (unset: a fixed cap).
    std::optional<AutotuneEvent> autotune;
    // The network partition from the switch on (unset: unchanged).
    std::optional<size_t> partition_bytes;
  };
  void Run();
  absl::StatusOr<Decision> Decide();
  // This node's caps and schedule for the switch after iteration k (node
  // rank 0's choice wins across nodes): the job's caps, or autotune's.
  void ChooseCaps(int round, uint64_t k, const std::vector<int32_t>& order,
                  v1::RebuildOrder* mine);
  absl::StatusOr<BucketPlan> PlanFor(const v1::RebuildOrder& o) const;
  absl::Status Switch(uint64_t iteration, BucketPlan plan,
                      std::optional<size_t> partition_bytes);
  void Finish(const absl::StatusOr<Decision>& decision, uint64_t iteration);
  std::string JobName() const;

  Job* const job_;
  const RebuildOptions options_;

  mutable absl::Mutex mu_;
  std::vector<std::optional<Waiting>> ranks_ ABSL_GUARDED_BY(mu_);
  int count_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t iteration_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time local_deadline_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  // First reason this rebuild cannot go on (rank gone, bad request), or OK.
  absl::Status abort_ ABSL_GUARDED_BY(mu_);
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  // Whether the rebuild ran (well or not): it happens once.
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool rebuilt_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t rebuilt_after_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<int32_t> ready_order_ ABSL_GUARDED_BY(mu_);
  // Autotune: the round (0: the rebuild) and the switch the last answer
  // named (0: none).
  int round_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_switch_after_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

// Multi-node: node rank 0's `mine` wins; every node gets it back once all
// have acknowledged the plan it gives. `plan_fingerprint(order)` is what
// every node's plan from the winning order must agree on. Errors name the
// job and the node ranks missing or disagreeing; DEADLINE_EXCEEDED after
// `timeout`; CANCELLED when `cancelled()` turns true.
struct RebuildAgreement {
  std::string job_id;
  std::string prefix;  // the formation round
  int node_rank = 0;
  int num_nodes = 1;
  absl::Duration timeout = absl::Seconds(60);
  std::function<bool()> cancelled;
};
[[nodiscard]] absl::StatusOr<v1::RebuildOrder> AgreeOnRebuild(
    RendezvousStoreInterface& store, const RebuildAgreement& agreement,
    const v1::RebuildOrder& mine,
    const std::function<absl::StatusOr<std::string>(const v1::RebuildOrder&)>&
        plan_fingerprint);

// The coordinator for `job` with the daemon's bounds: local waits like
// attaches (attach_timeout_ms), node agreement like the formation
// (rendezvous.formation_timeout_ms, through the coordinator and round the job
// formed through, connected by `coordinators`), the engine switch within
// rendezvous.collective_timeout_ms.
std::unique_ptr<RebuildCoordinator> MakeRebuildCoordinator(
    Job* job, const v1::DaemonConfig& config,
    std::shared_ptr<const CoordinatorSelector> coordinators);

// The plan's buckets as the RPC carries them.
v1::RebuildBucketsResponse RebuildResponse(const BucketPlan& plan,
                                           uint64_t first_iteration);
// A short text that is equal for equal plans.
std::string PlanFingerprint(const BucketPlan& plan);

}  // namespace gradd

#endif  // GRADD_SERVER_ENGINE_JOB_REBUILD_H_
