// Every job on this node: attach/registration, job formation, detach and
// liveness. Implements the Node RPC handler (rpc/node_handler.h) and observes
// session sockets (engine/manager/session_registry.h).
//
// Files: the control loop and RPC entry points (job_manager.cc), pending
// attaches (job_manager_attach.cc; their checks in attach_validation.h),
// the hand-off to an active job (job_manager_formation.cc; the formation
// thread's body in form_nodes.h), node loss and arrival
// (job_manager_reformation.cc; the watcher thread's body in
// arrival_watcher.h), the admin view (job_manager_snapshot.cc);
// the state machines it keeps per job in classes of their own
// (pending_job.h, rank_restart_deadlines.h, node_epochs.h) and the session
// bindings (session_bindings.h).
//
// Threads: one control thread owns all state below (pending attaches, active
// jobs, session bindings); HandleAttach/HandleDetach/OnSessionClosed only
// post to it and return. Each active Job runs its own engine thread, so a
// slow or failed job never holds up another. Callbacks run on the control
// thread.
//
// A job's life:
//
//   (none) --first Attach--> pending --all local ranks, same model--> active
//              ^               |  timeout / mismatch / session closed  ^  |
//              |               v                         num_nodes > 1 |  |
//              +-------- (ranks answered with the error) <-- forming --+  |
//              +------------- every rank detached or disconnected --------+
//                             (memory released; the id may attach afresh)
//
// Rank restart (job.h's rank lifecycle): in an active job whose effective
// rank_restart_grace_ms is > 0 (attach_validation.h), a rank whose session
// closes without Detach is "restarting" (Job::RankRestarting) with a
// deadline this loop keeps (RankRestartDeadlines, NextDeadline); an Attach
// for that job id and rank that matches the job (CompareRestartAttach) is
// bound to its new session (SessionBindings), the engine takes the rank
// back (Job::RestartRank) and the Attach is answered with the same fds and
// AttachResponse.restarted. Past the deadline the job fails ABORTED naming
// the rank and the grace, and the rank is gone. A job whose every rank is
// restarting keeps waiting (its memory kept) until the grace runs out.
//
// Elastic multi-node jobs (job_manager_reformation.cc; job.h "Elastic
// multi-node jobs"): a job over several nodes with min_nodes or a rank
// restart grace re-forms its inter-node group instead of failing. The
// Job's reform handler (engine thread) posts the break here; a formation
// thread of its own agrees on the new membership through the store
// (formation/reformation.h) and posts the outcome back, which becomes a
// new HierarchicalReducer handed to Job::Reformed. A watcher thread per
// elastic job waits for nodes asking to be admitted and breaks the job's
// group for them. A node whose formation finds its job already running
// elastically is admitted into it instead of forming afresh; its ranks
// attach with rejoined = true.
//
// forming: the rendezvous with the other nodes' daemons (node_formation.h)
// runs on a thread of its own and posts its result back to the control
// thread, so other jobs on this daemon are served meanwhile. It is bounded
// by the formation timeout (and the ranks' Attach deadlines); a rank that
// leaves while its job forms fails the others at once and the result is
// dropped.
//
// A pending Attach holds no thread: its callback waits in pending_ until
// the job forms, it times out or its client cancels
// (HandleAttachCancelled), whichever comes first.
//
// Errors (Attach): INVALID_ARGUMENT (bad request, model mismatch naming the
// parameter and both ranks), ALREADY_EXISTS (rank taken), DEADLINE_EXCEEDED
// (missing ranks named), RESOURCE_EXHAUSTED (max_jobs / memory),
// FAILED_PRECONDITION (no live session, job running, model or plan mismatch
// between nodes naming the parameter and both nodes), UNAVAILABLE (shutting
// down, coordinator unreachable), DEADLINE_EXCEEDED (nodes missing after the
// formation timeout, named when rendezvous.expected_node_ids is configured).
#ifndef GRADD_SERVER_ENGINE_MANAGER_JOB_MANAGER_H_
#define GRADD_SERVER_ENGINE_MANAGER_JOB_MANAGER_H_

#include <atomic>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/bucket_planner.h"
#include "common/device_memory.h"
#include "common/thread_pool.h"
#include "gradd/v1/config.pb.h"
#include "server/engine/formation/nccl_job_setup.h"
#include "server/engine/formation/node_formation.h"
#include "server/engine/formation/reformation.h"
#include "server/engine/job/job.h"
#include "server/engine/job/job_snapshot.h"
#include "server/engine/job/rebuild.h"
#include "server/engine/manager/form_nodes.h"
#include "server/engine/manager/loop_watchdog.h"
#include "server/engine/manager/node_epochs.h"
#include "server/engine/manager/pending_job.h"
#include "server/engine/manager/rank_restart_deadlines.h"
#include "server/engine/manager/reformation_stall.h"
#include "server/engine/manager/session_bindings.h"
#include "server/engine/manager/session_registry.h"
#include "server/engine/observe/job_events.h"
#include "server/rendezvous/coordinator.h"
#include "server/rendezvous/store_interface.h"
#include "server/rpc/node_handler.h"

namespace gradd {

class JobManager final : public NodeHandlerInterface,
                         public SessionObserverInterface {
 public:
  // Makes the reducer of a job whose local ranks have all registered (control
  // thread). The default is FusedReducer over the local ranks; the
  // multi-node path plugs in its hierarchical reducer here.
  using ReducerFactory = absl::AnyInvocable<absl::StatusOr<
      std::unique_ptr<BucketReducerInterface>>(const JobSpec& spec)>;

  // `config` has defaults applied. `sessions` and `pool` (may be null:
  // reduce on the engine thread only) must outlive this object.
  // `coordinators` finds multi-node jobs' rendezvous coordinator (default:
  // one made from config's rendezvous section, serving on demand only and
  // without credentials, so refusing multi-node jobs: the Daemon passes
  // its own).
  // `events` (may be null) gets the engine's events (job_events.h) and
  // must outlive this object. Starts the control thread.
  JobManager(const v1::DaemonConfig& config, SessionRegistryInterface* sessions,
             ThreadPool* pool, ReducerFactory reducer_factory = nullptr,
             std::shared_ptr<CoordinatorSelector> coordinators = nullptr,
             EngineEventSinkInterface* events = nullptr,
             DeviceAllocatorInterface* devices = nullptr);
  ~JobManager() override;  // Stop()s

  void HandleAttach(v1::AttachRequest request, absl::Time deadline,
                    AttachCallback done) override;
  void HandleDetach(v1::DetachRequest request, DetachCallback done) override;
  void HandleRebuildBuckets(v1::RebuildBucketsRequest request,
                            absl::Time deadline, RebuildCallback done) override;
  void HandleSetCommHook(v1::CommHookSetRequest request,
                         SetCommHookCallback done) override;
  void HandleAttachCancelled(uint64_t session_id) override;
  void OnSessionClosed(uint64_t session_id) override;

  // Publishes `message` (UNAVAILABLE) in every job's control block, answers
  // every waiting Attach with it and refuses new ones. Blocks until done.
  void Shutdown(absl::string_view message = "gradd daemon shutting down");
  // Stops the control thread and every job's engine, releasing their
  // memory. Idempotent.
  void Stop();

  // Calls `ping` from the control thread every `interval` while it runs its
  // loop (systemd's watchdog: a hung control thread stops the pings). An
  // infinite interval turns it off. Any thread; takes effect once the
  // control thread gets to it.
  void SetWatchdog(absl::AnyInvocable<void()> ping, absl::Duration interval);

  // Pending + active jobs. Blocks briefly (runs on the control thread, after
  // everything posted before it).
  int NumJobs();

  // The admin API's view (job_manager_snapshot.cc): every job (pending,
  // forming, running), or only `*job_id`'s (NOT_FOUND naming it when there
  // is none); parameters and plans only with `detail`. Copied on the
  // control thread after everything posted before; DEADLINE_EXCEEDED when
  // it does not answer by `deadline` (a wedged control loop), UNAVAILABLE
  // once stopped. Any thread; blocks at most until `deadline`.
  absl::StatusOr<std::vector<JobSnapshot>> Snapshot(
      absl::Time deadline, bool detail, const std::string* job_id = nullptr);
  // OK when the control thread runs a task posted now by `deadline` and
  // the manager is not shutting down (UNAVAILABLE once Shutdown began):
  // what the health service reports. Other errors as Snapshot.
  absl::Status Ping(absl::Time deadline);
  // An active job's recent bucket events (engine/observe/timeline.h) and its
  // buckets stalled now (engine/observe/stall_inspector.h); empty for a job
  // still waiting for its ranks. NOT_FOUND naming the job when this daemon has
  // no such job; UNAVAILABLE when stopping. Any thread; runs on the control
  // thread like NumJobs.
  absl::StatusOr<std::vector<TimelineEvent>> Timeline(
      const std::string& job_id);
  absl::StatusOr<std::vector<StallReport>> Stalls(const std::string& job_id);

 private:
  // Lets formation threads post back to a JobManager that may be gone.
  struct Mailbox {
    absl::Mutex mu;
    JobManager* owner ABSL_GUARDED_BY(mu) = nullptr;
  };
  struct Reformable;
  struct ActiveJob {
    std::unique_ptr<Job> job;
    // Rank restart: the job's grace and its ranks away
    // (rank_restart_deadlines.h). Their sessions are in bindings_.
    RankRestartDeadlines restarts;
    // Declared after `job`: destroyed (and its thread joined) first.
    std::unique_ptr<RebuildCoordinator> rebuild;
    // Unique among the jobs this manager ever ran: results posted back for
    // a job id that ended meanwhile (and maybe attached afresh) are dropped.
    uint64_t generation = 0;
    // Set for a job re-formable across nodes (IsReformableAcrossNodes).
    std::unique_ptr<Reformable> reformable;
  };
  // Stops a re-formable job's watcher thread when its ActiveJob goes.
  struct StopFlag {
    std::shared_ptr<std::atomic<bool>> stopped =
        std::make_shared<std::atomic<bool>>(false);
    StopFlag() = default;
    StopFlag(StopFlag&&) = default;
    StopFlag& operator=(StopFlag&&) = default;
    ~StopFlag() {
      if (stopped) stopped->store(true);
    }
  };
  // What a re-formable job has beyond an ActiveJob: its epochs
  // (node_epochs.h: membership, epoch, re-formation, arrivals, stall; the
  // state machine) and the resources of its watcher thread.
  struct Reformable {
    explicit Reformable(NodeEpochs e) : epochs(std::move(e)) {}
    NodeEpochs epochs;
    StopFlag watcher;
    // Hold the job's formation round and elastic namespace in the store
    // while it runs here (RendezvousStoreInterface::ReleaseRoundWhenDone): the
    // reducers' clients change with every re-formation, so these are
    // kept apart and released when the job ends on this node.
    std::vector<std::unique_ptr<RendezvousStoreInterface>> releases;
  };
  using Task = absl::AnyInvocable<void() &&>;

  void Post(Task task);
  // Runs `fn` on the control thread and waits for its result until
  // `deadline` (job_manager_snapshot.cc).
  template <typename T>
  absl::StatusOr<T> AskControlThread(absl::AnyInvocable<T() &&> fn,
                                     absl::Time deadline);
  JobSnapshot SnapshotOf(const std::string& id, const PendingJob& pending,
                         bool detail) const;
  JobSnapshot SnapshotOf(const ActiveJob& active, bool detail) const;
  // Runs `fn(job)` on the control thread for job `job_id` (null while it
  // is pending) and returns its result; errors as Timeline's.
  template <typename T>
  absl::StatusOr<T> QueryJob(const std::string& job_id,
                             absl::AnyInvocable<T(const Job*)> fn);
  // Queues `work(std::move(done))` for the control thread; when the manager
  // is stopping, answers `done(if_stopping)` at once instead, so no RPC is
  // left unanswered. Any thread.
  template <typename Callback, typename Work>
  void PostOrAnswer(Callback done, absl::Status if_stopping, Work work);
  void Loop();
  absl::Time NextDeadline() const;
  // Stamps every active job's heartbeat when it is due.
  void Beat(absl::Time now);

  void DoDetach(const v1::DetachRequest& request, DetachCallback done);
  void DoSessionClosed(uint64_t session_id);
  void DoRebuild(v1::RebuildBucketsRequest request, absl::Time deadline,
                 RebuildCallback done);
  void DoSetCommHook(const v1::CommHookSetRequest& request,
                     SetCommHookCallback done);
  void RankGone(const std::string& job_id, int rank, bool detached);
  // Rank restart (job_manager_restart.cc). An Attach for active job
  // `active`: re-attaches its restarting rank, or refuses as before.
  void DoRestartAttach(ActiveJob& active, v1::AttachRequest request,
                       std::vector<ParamInfo> params, int device,
                       AttachCallback done);
  // Fails the jobs whose restarting ranks' grace is over.
  void ExpireRestarts(absl::Time now);

  // Pending attaches (job_manager_attach.cc).
  void DoAttach(v1::AttachRequest request, absl::Time deadline,
                AttachCallback done);
  void ExpireAttaches(absl::Time now);
  // The client of session `session_id`'s pending Attach gave up: its rank
  // is free again at once (a job forming with other nodes fails, ABORTED).
  void DoAttachCancelled(uint64_t session_id);
  // An Attach of session `session_id` ended without binding it: the
  // session counts as idle again (SessionRegistryInterface::Unclaim).
  void Unbind(uint64_t session_id);
  void FailPending(const std::string& job_id, const absl::Status& status);
  // Takes local rank `rank`'s attach out of pending job `job_id`, answers
  // it with `answer` and unbinds its session (SessionRegistryInterface::
  // Unclaim too when `unclaim`). A job forming with other nodes fails as a
  // whole, ABORTED "<what> while the job was forming with the other
  // nodes"; one still collecting its ranks goes once none is left. False
  // (nothing done) when that rank has no pending attach.
  bool WithdrawPendingRank(const std::string& job_id, int rank,
                           absl::Status answer, absl::string_view what,
                           bool unclaim);
  // Every local rank attached: checks that they agree, plans and makes the
  // job's spec, then activates it or starts its formation.
  void FormJob(const std::string& job_id);

  // Pending to active (job_manager_formation.cc).
  // Multi-node: starts the formation thread for a pending job whose local
  // ranks agree; `spec` is the local part of the job.
  void StartNodeFormation(const std::string& job_id, JobSpec spec);
  // Control thread: the formation thread's result.
  void FinishNodeFormation(const std::string& job_id, uint64_t formation,
                           JobSpec spec, absl::StatusOr<FormedNodes> result);
  // Creates the job, hands every rank its memory and answers the Attaches
  // (rejoined = true for a node admitted into its running job).
  void Activate(
      const std::string& job_id, JobSpec spec,
      absl::StatusOr<std::unique_ptr<BucketReducerInterface>> reducer,
      std::vector<JobNode> members = {},
      std::optional<NodeAdmission> admission = std::nullopt,
      std::vector<std::unique_ptr<RendezvousStoreInterface>> releases = {});

  // Elastic multi-node jobs (job_manager_reformation.cc). The collective
  // timeout between nodes: collective_timeout_ms, plus the job's rank
  // restart grace when it has one (a peer waits in the network while a
  // rank of another node restarts).
  absl::Duration InterNodeCollectiveTimeout(uint32_t grace_ms) const;
  // The reducer between nodes for `spec` over `layout`, agreeing under
  // `store_prefix`.
  std::unique_ptr<BucketReducerInterface> MakeNodeReducer(
      const JobSpec& spec, const JobLayout& layout,
      const std::string& store_prefix,
      std::unique_ptr<CollectiveBackendInterface> backend,
      std::unique_ptr<RendezvousStoreInterface> store);
  // Before Start: sets the job's reform handler and starts its watcher.
  void MakeReformable(
      ActiveJob& active, const std::vector<JobNode>& members, int node_rank,
      int max_nodes, int64_t arrivals_seen, uint64_t epoch,
      std::vector<std::unique_ptr<RendezvousStoreInterface>> releases);
  // Control thread: a break of job `job_id` (generation `generation`),
  // posted by its reform handler; starts the re-formation thread.
  void StartReformation(const std::string& job_id, uint64_t generation,
                        Job::ReformationRequest broke);
  // Control thread: the re-formation thread's result.
  void FinishReformation(const std::string& job_id, uint64_t generation,
                         std::string reason, absl::StatusOr<Reformed> result,
                         std::unique_ptr<RendezvousStoreInterface> store);
  // Control thread: the watcher saw arrival `n` announced.
  void ArrivalSeen(const std::string& job_id, uint64_t generation, int64_t n);

  const v1::DaemonConfig config_;
  SessionRegistryInterface* const sessions_;
  ThreadPool* const pool_;
  ReducerFactory reducer_factory_;
  std::shared_ptr<CoordinatorSelector> coordinators_;
  EngineEventSinkInterface* const events_;
  // Where CUDA buckets are allocated (never null: a NoDeviceAllocator when
  // the daemon was given none).
  std::unique_ptr<DeviceAllocatorInterface> no_devices_;
  DeviceAllocatorInterface* devices_;

  absl::Mutex mu_;
  std::deque<Task> tasks_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;

  // Control thread only.
  absl::Time next_heartbeat_ = absl::InfinitePast();
  LoopWatchdog watchdog_;
  bool shutting_down_ = false;
  std::string shutdown_message_;
  uint64_t next_attach_id_ = 1;
  uint64_t next_formation_ = 1;
  uint64_t next_generation_ = 1;
  std::shared_ptr<Mailbox> mailbox_ = std::make_shared<Mailbox>();
  absl::flat_hash_map<std::string, PendingJob> pending_;
  absl::flat_hash_map<std::string, ActiveJob> jobs_;
  // Which session holds which rank, pending and active
  // (session_bindings.h).
  SessionBindings bindings_;
};

}  // namespace gradd

#endif  // GRADD_SERVER_ENGINE_MANAGER_JOB_MANAGER_H_
