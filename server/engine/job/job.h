// One job on this node, once every local rank has attached: its shared
// memory (control block + one bucket memfd per rank) and its engine thread.
//
// Owns: the control-block and rank memfds (until handed out) and their
// mappings, the engine thread, the reducer.
// Threads: the engine thread (started by Start) runs the reduce loop and
// hands buckets and broadcasts to the reducer; the reducer's completion
// (engine thread for the fused path, the network thread for the
// hierarchical one) is the only writer of done_seq / bcast_done_seq, one
// completion per bucket or broadcast in flight; RankGone/Fail/Stop are
// called from the JobManager's thread. Errors reach trainers through the
// control block (status + message), never through return values.
//
// Rank lifecycle, per local rank:
//
//   attached --(Detach RPC)----------> detached     \  error published only if
//       \-----(session socket closes)-> disconnected /  another rank is waiting
//       |                                  ^           on work that needed it
//       |  grace > 0, no join in play,     | grace over (JobManager): the job
//       |  no rebuild pending              | fails ABORTED naming the rank
//       |  (RankRestarting)                |
//       +-----------------------------> restarting ---(Attach again, same
//       ^                                             model: RestartRank)---+
//       |  engine, at a point where no bucket or round is with the     |
//       |  reducer: aborts the iteration / collective round in         |
//       |  progress, resets the rank's rows, restarts++, sync_seq++    |
//       +--------------------------------------------------------------+
//
// Rank restart (common/control_block.h, "Rank restart"; job_restart.cc).
// While a rank is restarting, what needs it waits (CheckStuck and the stall
// shutdown leave it alone): the work it had handed over before dying still
// completes, its memory staying mapped here. The JobManager keeps the
// grace's deadline; the daemon keeps its copies of the rank's fds
// (ReleaseFds keeps them for a job with a grace), so the new process gets
// the same memory and the same bell, whose write end the daemon holding a
// copy never sees hang up.
//
// Events (job_events.h): the engine notes when it first sees each rank hand
// a bucket over (in its scan) and when it starts the bucket; the reducer
// records the bucket's phases (BucketWork::timing); the completion emits
// the bucket's event (to timeline_ and the sinks, e.g. metrics) just
// before publishing done_seq, so the engine may reuse the bucket's
// bookkeeping (traces_, bucket_traces.h) once it sees done. Every few tens of
// ms the engine thread hands the buckets that wait to stalls_
// (stall_inspector.h), which may fail the job past stall_shutdown.
//
// Join (uneven inputs): the engine side of join_state.h lives in
// job_join.cc. While a join epoch runs, buckets start only for the
// iteration the JoinState is running, with the active ranks' buffers and
// the round's divisor; any rank that goes away fails the job.
//
// Plan switch (bucket rebuild; engine/job/rebuild.h decides the new plan, the
// engine side lives in engine/job/job_rebuild.cc). The control block has a
// slot per parameter and the rank memory a bucket region that holds any
// plan (MaxPlanBytes), so a switch reallocates nothing:
//
//   running --ExpectRebuild(k)--> expecting k --SwitchPlan(k, plan)-->
//   switching
//      ^      a rank publishing iteration k + 1 meanwhile: job error        |
//      |      naming it (it skipped the rebuild the others wait in)         |
//      +-- every bucket done == started == k (engine thread): plan_ = plan, +
//          new buckets' done_seq and every rank's ready rows set to k,
//          reducer Replan(k + 1), done(OK)
//
// The ready rows are written by the daemon here, against the rule that
// rank r writes only its own: every rank is blocked in RebuildBuckets
// until done runs, so nobody else writes them. The engine's side of the
// switch is plan_switch.h.
//
// Phase (engine thread): one for the whole job, changed only by
// EnterPhase, which reports every change (JobEventSinkInterface::OnPhase):
//
//   running <--> switching_plan      (a plan switch waits for its boundary)
//   running --> draining --> reforming --> running   (epoch_state.h)
//   any --> failed (FailOnEngine, or a failure published from outside,
//                   e.g. a completion's error or the daemon's shutdown)
//
// The sub-machines keep their own detail: ReformationDriver and its
// EpochState (re-formation), PlanSwitch (plan switch), RankRestarts (rank
// restart's abort rules) and JoinState (join, uneven inputs).
//
// What other threads hand the engine goes through small mailboxes that
// own their lock and "anything there" flag (mailbox.h): RankRestartInbox,
// PlanSwitchRequests, the re-formation's ReformationInbox; RankStates,
// ReducerSlot, ReducerHandOvers and JoinRoundResult carry the rest, and
// PublishedState what other threads read. The engine's scan reads their
// flags (one atomic each) and locks nothing per bucket.
#ifndef GRADD_SERVER_ENGINE_JOB_JOB_H_
#define GRADD_SERVER_ENGINE_JOB_JOB_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/bucket_planner.h"
#include "common/control_block.h"
#include "common/control_mapping.h"
#include "common/device_memory.h"
#include "common/doorbell.h"
#include "common/shm.h"
#include "gradd/v1/node.pb.h"
#include "server/engine/job/bucket_autotune.h"
#include "server/engine/job/bucket_traces.h"
#include "server/engine/job/epoch_state.h"
#include "server/engine/job/job_snapshot.h"
#include "server/engine/job/join_state.h"
#include "server/engine/job/plan_switch.h"
#include "server/engine/job/plan_switch_requests.h"
#include "server/engine/job/published_state.h"
#include "server/engine/job/rank_restarts.h"
#include "server/engine/job/rank_states.h"
#include "server/engine/job/reducer_hand_offs.h"
#include "server/engine/job/reformation_driver.h"
#include "server/engine/job/reformation_inbox.h"
#include "server/engine/observe/iteration_tracker.h"
#include "server/engine/observe/job_events.h"
#include "server/engine/observe/stall_inspector.h"
#include "server/engine/observe/timeline.h"
#include "server/engine/reduce/bucket_reducer.h"
#include "server/engine/reduce/device_reducer.h"
#include "server/hooks/comm_hook_factory.h"

namespace gradd {

struct JobSpec {
  std::string job_id;
  int local_world_size = 1;
  std::vector<ParamInfo> params;
  BucketPlan plan;
  // The caps the plan was made with (a bucket rebuild re-plans with them).
  PlannerOptions planner;
  // Autotune (bucket_autotune.h): after the bucket rebuild the job tries
  // these caps and keeps the fastest; planner.bucket_cap_bytes is the cap
  // until then (and the fallback).
  bool autotune = false;
  AutotuneOptions autotune_options = DefaultAutotuneOptions();
  uint64_t broadcast_bytes = 0;
  // Engine doorbell spin before sleeping.
  std::chrono::microseconds spin{50};
  // Where this node's ranks sit in a multi-node job (defaults: one node,
  // global rank = local rank). world_size 0 means local_world_size.
  int node_rank = 0;
  int num_nodes = 1;
  int global_rank_offset = 0;
  int world_size = 0;
  // Multi-node: every node's id by node rank (the admin API; stall reports
  // name them).
  std::vector<std::string> node_ids;
  // Multi-node: the rendezvous coordinator and formation round the job
  // formed through (a bucket rebuild agrees through them).
  std::string coordinator;
  std::string round_prefix;

  // The job's communication hook as chosen at attach (validated; "":
  // allreduce), until a rank's SetCommHook; and the pool hooks split their
  // local work across (may be null).
  v1::CommHookSpec comm_hook;
  ThreadPool* hook_pool = nullptr;

  // Observability (job_events.h): the size of the job's timeline, the
  // stall thresholds (stall_inspector.h; 0: off).
  size_t timeline_events = 4096;
  std::chrono::milliseconds stall_warning{0};
  std::chrono::milliseconds stall_shutdown{0};
  // GPU path: where the ranks' CUDA buckets are allocated (null, or
  // rank_devices all -1: the job has no CUDA parameters) and each local
  // rank's device ordinal as the daemon sees it (device_attach.h).
  DeviceAllocatorInterface* devices = nullptr;
  std::vector<int> rank_devices;
  // Bound on one device collective (NCCL) before the job fails and its
  // communicators are aborted (rendezvous.collective_timeout_ms).
  std::chrono::milliseconds collective_timeout{30000};
  // Multi-node CUDA jobs: what the formation set up for the CUDA buckets
  // between the nodes (nccl_job_setup.h): NCCL communicators, or why they
  // are staged through host memory; null: not set up (staged). Only until
  // the job's reducer is made: JobManager::Activate leaves it to the
  // device reducer, and a re-formation hands the new group's to the new
  // reducer (Reformed::nccl), so the old communicators go with the old
  // reducer.
  std::shared_ptr<NcclJobSetup> nccl_between_nodes;
  // Rank restart: how long the job waits for a local rank whose session
  // closed without Detach (0: it does not wait, the rank is gone). The
  // JobManager enforces it; here it decides whether the fds are kept.
  std::chrono::milliseconds rank_restart_grace{0};
  // Node loss and arrival (control_block.h "Re-formation"; job_reformation.cc):
  // the smallest node count the job goes on with (0: not elastic across
  // nodes; a multi-node job with a rank restart grace is elastic too), the
  // divisor rule after a re-formation, and the job's elastic namespace in
  // the store (formation/reformation.h).
  int min_nodes = 0;
  bool divide_by_initial_world_size = false;
  std::string reformation_prefix;
  // A node admitted into its running elastic job (the JobManager's
  // formation found it running): the control block starts at the agreed
  // epoch and sync_seq, and state_behind (its ranks offer no state in the
  // first state sync). 0 / false for a job formed afresh.
  uint64_t initial_epoch = 0;
  uint64_t initial_sync_seq = 0;
  bool initial_state_behind = false;
  // The job's initial world size (the global world size it first formed
  // with), which such a node learns from the agreement that admitted it
  // (formation/reformation.h "members"): its world_size is the live one.
  // 0: this node formed with the job, world_size is the initial one.
  int initial_world_size = 0;
  // Such a node: the job's nodes lost and not back (the agreement's
  // departed list), so that it lists the same lost nodes as the others.
  std::vector<std::string> initial_lost;
  // The job's first iteration on this node: 1, or for such a node the one
  // the running nodes go on at (max completed + 2: the re-formation that
  // admits it aborts max completed + 1 on them), so that an iteration has
  // the same number on every node (graddctl, logs, rejoin_iteration).
  uint64_t first_iteration = 1;

  int global_world_size() const {
    return world_size > 0 ? world_size : local_world_size;
  }
  // What divide_by_initial_world_size divides by, what the snapshot calls
  // the initial world size and what this node publishes in re-formations.
  int initial_global_world_size() const {
    return initial_world_size > 0 ? initial_world_size : global_world_size();
  }
  // What the device reducer is given of the job (reduce/device_reducer.h,
  // WrapDeviceReducer; job_device.cc).
  DeviceJobSpec device_spec() const;
};

// Implements the JobSide of its re-formation driver (privately: only the
// driver calls it).
class Job final : private ReformationDriver::JobSide {
 public:
  // Allocates the control block and every rank's memory (sealed memfds) and
  // initialises the block. RESOURCE_EXHAUSTED / INTERNAL when memory cannot
  // be had. Does not start the engine.
  static absl::StatusOr<std::unique_ptr<Job>> Create(
      JobSpec spec, std::unique_ptr<BucketReducerInterface> reducer);
  ~Job();  // Stop()s

  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  // Before Start: the job's events go to `sink` (may be null) too, besides
  // its own timeline; the job owns it and destroys it when it ends.
  void AddEventSink(std::unique_ptr<JobEventSinkInterface> sink) {
    events_.Add(std::move(sink));
  }
  // Starts the engine thread.
  void Start();
  // Stops and joins the engine thread (wakes it; bounded by one reduction).
  void Stop();

  const std::string& id() const { return spec_.job_id; }
  const JobSpec& spec() const { return spec_; }
  int local_world_size() const { return spec_.local_world_size; }
  // The current plan: before Start, or on the engine thread (a rebuild
  // replaces it there).
  const BucketPlan& plan() const { return plan_; }
  size_t rank_memory_bytes() const { return rank_bytes_; }
  // Shared memory held for the job: every rank's memory and control block,
  // and the job block.
  uint64_t shared_memory_bytes() const {
    return (rank_bytes_ + layout_.rank_block_bytes()) *
               static_cast<uint64_t>(spec_.local_world_size) +
           layout_.job_bytes();
  }
  // The bucket region (any plan fits) ends where the broadcast area starts.
  size_t broadcast_offset() const { return bucket_region_bytes_; }
  uint32_t bucket_slots() const { return layout_.num_buckets(); }

  // The fds to send to local rank r: [job block (read-only for it), rank r's
  // memory, rank r's control block, the write end of rank r's bell], then
  // rank r's device memory when the job has CUDA buckets.
  std::vector<int> FdsFor(int rank) const;
  // Closes the daemon's copies of the memfds and bell write ends once every
  // rank has its own; a job with a rank restart grace keeps them (a
  // restarted rank is sent them again).
  void ReleaseFds();
  // Attach reply (plan, sizes) for local rank r. Reads the plan: call it
  // before any rank can ask for a rebuild (the JobManager answers the
  // Attaches with it).
  v1::AttachResponse ResponseFor(int rank) const;

  // Local rank r is gone (detached == true: clean Detach; else its session
  // closed). The engine decides whether anyone is stuck. Any thread.
  void RankGone(int rank, bool detached);
  // Number of ranks that have not gone (restarting ones are not live).
  int live_ranks() const;

  // Rank restart (job_restart.cc). Local rank r's session closed without
  // Detach and the job waits for it to attach again: from now on work that
  // needs r waits instead of failing. False (and nothing done) when r is
  // not live or the job cannot wait (no grace, a bucket rebuild expected or
  // switching); the caller then treats r as gone. `reason` goes to the log
  // and the events. Any thread.
  bool RankRestarting(int rank, absl::string_view reason);
  bool restarting(int rank) const;
  int restarting_ranks() const;
  // What a re-attached rank is told: ResponseFor(rank) with rejoined,
  // next_iteration, collective_seq and sync_seq set, made on the engine
  // thread (the plan is the engine's); the caller adds the attach id.
  using RankRestartDone = ::gradd::RankRestartDone;  // rank_states.h
  // Restarting local rank r attached again (checked by the caller): the
  // engine thread, at its next point where no bucket or round is with the
  // reducer, does what control_block.h "Rank restart" says and runs
  // done(response) there; done(error) instead if the job has failed, stops
  // first, or r is not restarting. Any thread. In a job elastic across
  // nodes the return re-forms the inter-node group instead ("Elastic
  // multi-node jobs" below; reason "local rank r restarted"): done runs
  // after Reformed, with the re-formation's single abort and its agreed
  // sync_seq (no separate bump).
  void RestartRank(int rank, RankRestartDone done);
  // Restarted ranks re-attached, iterations aborted by them (any thread).
  uint64_t restarts() const;
  // Collective rounds (broadcasts, the collectives API) done so far,
  // aborted ones included. Any thread.
  uint64_t collective_rounds() const {
    return header_->bcast_done_seq.load(std::memory_order_acquire);
  }
  uint64_t iterations_aborted() const {
    return iterations_aborted_.load(std::memory_order_relaxed);
  }

  // Elastic multi-node jobs: epochs and re-formation on node loss and
  // arrival (reformation_driver.h, job_reformation.cc; control_block.h
  // "Re-formation"). A job survives them when num_nodes > 1 and
  // min_nodes > 0 or it has a rank restart grace.
  //
  //   running --network error / RequestReformation / multi-node RestartRank-->
  //   draining (nothing new to the reducer; what is with it completes,
  //             failures are not the job's) --nothing with the reducer-->
  //   reforming (handler runs; ranks wait, heartbeats go on)
  //             --Reformed(ok)--> running on the new reducer, after the
  //               one abort of the iteration and round in progress (or
  //               the next) and the sync_seq / epoch / world_size update;
  //               pending rank restarts answered
  //             --Reformed(error)--> failed (the error names the lost
  //               nodes / the reason)
  // The engine's word to the handler and the re-formation's answer
  // (reformation_inbox.h).
  using ReformationRequest = ::gradd::ReformationRequest;
  using ReformationResult = ::gradd::ReformationResult;
  using ReformationHandler = ReformationDriver::Handler;
  // Before Start. Called on the engine thread once per break, when the
  // reducer is drained; the receiver re-forms (off that thread) and
  // answers with Reformed.
  void SetReformationHandler(ReformationHandler handler);
  // Any thread: break the job's inter-node group at the next point where
  // nothing is with the reducer (e.g. a node asks to be admitted). No-op
  // for a job that is not elastic across nodes.
  void RequestReformation(std::string reason);
  // Any thread: the outcome of the re-formation the handler started.
  void Reformed(absl::StatusOr<ReformationResult> result);
  // Re-formations so far (any thread).
  uint64_t epoch() const;

  // Stamps the control block's heartbeat (clients watch it). Any thread.
  void Heartbeat();

  // Publishes a job failure now (e.g. daemon shutdown). Any thread.
  void Fail(absl::StatusCode code, absl::string_view message);

  // Local rank `rank` chooses the job's communication hook (Node.SetCommHook;
  // errors as CommHookSelection::Set). Any thread. The engine settles the
  // choice when the job's first bucket is about to start: ranks that
  // disagree, or nodes that do, fail the job with the reason.
  absl::Status SetCommHook(int rank, const v1::CommHookSpec& spec) {
    return hooks_.Set(rank, spec);
  }

  // The job's failure, or OK (reads the control block).
  absl::Status status() const;

  // Bucket rebuild (see the state machine above). Any thread. From now on
  // a rank that publishes a bucket for an iteration after `iteration`
  // fails the job.
  void ExpectRebuild(uint64_t iteration);
  // The job's autotune (JobSpec::autotune), or null. Any thread (the
  // record locks).
  AutotuneRecord* autotune() const { return autotune_.get(); }
  // Reports an autotune switch to the job's event sinks (metrics). The
  // rebuild coordinator's thread.
  void ReportAutotune(const AutotuneEvent& event) { events_.OnAutotune(event); }
  // Any thread. Replaces the plan by `plan` (checked by the caller against
  // the job's parameters) once iteration `iteration` is complete, then
  // runs `done(OK)` on the engine thread; `done(error)` instead if the job
  // fails or stops first, or if the engine finds the job past `iteration`.
  // One switch at a time (a second one: done(FAILED_PRECONDITION)).
  using SwitchDone = PlanSwitchRequests::Done;
  // `partition_bytes` (autotune): the reducer's network partition from the
  // iteration after `iteration` on (BucketReducerInterface::
  // SetPartitionBytes; unset: unchanged).
  void SwitchPlan(uint64_t iteration, BucketPlan plan, SwitchDone done,
                  std::optional<size_t> partition_bytes = std::nullopt);

  // For tests and stats: iteration last completed for bucket b.
  uint64_t done_seq(int bucket) const;
  // Cumulative per-phase times of the job's reducer. Any thread.
  // Those of the reducers a re-formation retired included.
  ReducerStats reducer_stats() const;
  // The job's recent bucket events (timeline.h) and its buckets stalled
  // now (stall_inspector.h). Any thread.
  std::vector<TimelineEvent> timeline() const { return timeline_.Snapshot(); }
  std::vector<StallReport> stalls() const { return stalls_.Current(); }

  // The job as the admin API shows it (job_snapshot.cc): plan, done
  // sequences, rank states, reducer totals, failure, the last used map.
  // Parameters and buckets only with `detail`. Ranks' session ids and the
  // job's state beyond running / failed are the JobManager's to fill in.
  // Any thread: reads the control block's atomics and copies what the
  // engine published (published_state.h).
  JobSnapshot Snapshot(bool detail) const;

 private:
  // The job's phase (see the top of this file; job_snapshot.h JobPhase).
  // Engine thread; Snapshot reads the copy in published_.
  using Phase = JobPhase;
  static absl::string_view PhaseName(Phase phase) {
    return JobPhaseName(phase);
  }
  // The one transition function: moves phase_ to `next` and reports the
  // change (`why`) to the events and the log. No-op when already there;
  // kFailed is final.
  void EnterPhase(Phase next, absl::string_view why) override;
  bool failed() const { return phase_ == Phase::kFailed; }
  // The engine's one way to fail the job: publishes the failure
  // (PublishFailure) and enters kFailed. Returns false, so a check reads
  // `return FailOnEngine(...)`.
  bool FailOnEngine(absl::StatusCode code, absl::string_view message);

  Job(JobSpec spec, std::unique_ptr<BucketReducerInterface> reducer);
  void Loop();
  // One pass over buckets and broadcast; true if something was started.
  bool Scan();
  bool ScanBroadcast();
  // ScanBroadcast's path for collective rounds other than broadcast
  // (allreduce, allgather, ...): checks that every local rank from `first`
  // on describes the same round, then hands it to the reducer.
  bool StartAreaCollective(uint64_t need, int first, bool join_mode);
  // Hands round `work` (a broadcast or another collective round) to the
  // reducer; its completion publishes bcast_done_seq or the failure, named
  // "<what> <seq>". `what` must outlive the round (a literal).
  void StartRound(const BroadcastWork& work, absl::string_view what);
  void CheckStuck();
  // Join (job_join.cc). JoinInPlay: an epoch runs or some rank opened one.
  bool JoinInPlay() override;
  // Advances the JoinState: polls the ranks, starts / resolves rounds,
  // publishes outcomes. True if something changed.
  bool StepJoin();
  // kRunning: starts the iteration's buckets with the active ranks.
  bool ScanJoinBuckets();
  void PublishJoinOutcome(const JoinState::Outcome& outcome);
  std::vector<JoinRankView> ReadJoinViews(uint64_t next_iteration);
  // Local rank r's `row` read as *s lags behind the job because r joined
  // and has not caught up yet (common/control_block.h): true means "not
  // ready". Otherwise re-reads the row into *s.
  bool Lagging(int rank, const std::atomic<uint64_t>& row, uint64_t* s);
  void FailGoneInJoin();
  // Engine thread: settles the hook and hands it to the reducer; false (job
  // failed) when ranks or nodes disagree or the hook cannot be built.
  bool ResolveCommHook();
  // Builds the resolved hook over plan_ and hands it to the reducer.
  absl::Status InstallCommHook();
  // Hands bucket `b` of `iteration` to the reducer: the sum over `buffers`
  // (which must stay put until Complete) divided by `divisor` (0: the
  // reducer's own); Complete follows.
  // `ranks`: the local rank of each buffer (null: every rank, in order).
  void StartBucket(size_t b, uint64_t iteration,
                   const std::vector<void*>* buffers, double divisor,
                   const std::vector<int>* ranks = nullptr);
  void Complete(int bucket, uint64_t iteration, absl::Status status);
  // Engine thread, at most every few tens of ms: hands the waiting buckets
  // to the stall inspector; fails the job past stall_shutdown.
  void CheckStalls();
  // Publishes the job's failure in the control block (the first one wins)
  // and reports it. Any thread; the engine thread fails through
  // FailOnEngine, and notices a failure published elsewhere.
  void PublishFailure(absl::StatusCode code, absl::string_view message);
  std::string RankName(int rank) const;
  // job_rebuild.cc, engine thread: applies a pending SwitchPlan if the
  // engine is at its iteration boundary; true if it did. Fails the job and
  // returns false when the switch cannot happen.
  bool TrySwitchPlan();
  // Completes a pending SwitchPlan with `status` (job failed / stopping;
  // OK: stopping) and ends the engine's side of it.
  void AbortSwitch(const absl::Status& status);
  // Points bucket_buffers_ at plan_'s buckets in every rank's memory (its
  // device memory for CUDA buckets) and publishes plan_ for Snapshot
  // (job_snapshot.cc: PublishPlan).
  void MapBuckets();
  void PublishPlan();
  // Engine or reducer thread, when the bucket holding the client's used map
  // (find_unused_parameters) completed `iteration`: records which
  // parameters no rank used. `map` is the reduced map (float32, one per
  // model parameter) in a contributing rank's bucket, not yet handed back.
  void RecordUsedMap(uint64_t iteration, const float* map);
  // job_restart.cc, engine thread: runs the pending rank restarts if no bucket
  // or round is with the reducer; true if it did.
  bool TryRestartRanks();
  void RestartRankNow(int rank, RankRestartDone done);
  // What a rank that is not restarting is told when it attaches as if.
  absl::Status NotRestarting(int rank) const;
  // Create: every rank's device memory on its GPU, when the job has CUDA
  // parameters (job_device.cc).
  absl::Status AllocateDeviceMemory();

  // Steps 1-2 of control_block.h "Rank restart", shared by a local rejoin
  // and a re-formation (engine thread, nothing with the reducer): aborts
  // the iteration in progress or else the next one, and the collective
  // round in progress or else the next one; `aborted_rank` is the local
  // rank that caused it (-1: a re-formation).
  using Abort = RankRestarts::Aborted;
  Abort AbortInProgress(int aborted_rank);
  // Step 3 for a restarting rank: its rows, join slot and state; restarts++.
  // False (done answered) when r went away meanwhile.
  bool ResetRestartedRank(int rank, const Abort& abort, RankRestartDone* done);

  // The re-formation driver's JobSide (reformation_driver.h;
  // job_reformation.cc, job_restart.cc), engine thread.
  void FailJob(absl::string_view message) override;
  ReformationRequest ReadControl() override;
  Abort StartNewGroup(const ReformationResult& result) override;
  void RankBack(RankRestartInbox::Request request, const Abort& abort,
                const ReformationResult& result) override;
  // Every reducer hand-over counts itself in hand_overs_ until its
  // completion (ReducerWorkDone); a completion with an error in an elastic
  // job notes the break instead of failing the job (`what` names the
  // work). False: not elastic, the caller fails the job.
  bool NoteInterNodeError(const absl::Status& status, absl::string_view what);
  void ReducerWorkDone() {
    if (hand_overs_.Done()) doorbell_->Ring();
  }
  // The live global world size (the spec's until a re-formation).
  int live_world_size() const;
  // The ranks' world size now: the live one less this node's ranks gone
  // or restarting (the rank restart events).
  int ranks_world_size() const {
    return live_world_size() - (spec_.local_world_size - live_ranks());
  }

  const JobSpec spec_;
  const ControlLayout layout_;
  // Bucket region of every rank's memory: MaxPlanBytes(params).
  const size_t bucket_region_bytes_;
  // Reset first in ~Job: its completions write into the mappings below.
  // Replaced (engine thread) by a re-formation; null while the job
  // re-forms (reducer_hand_offs.h).
  ReducerSlot reducer_;
  size_t rank_bytes_ = 0;

  // The job block (sealed read-only for everyone but this mapping), every
  // rank's control block and bell (common/control_block.h).
  UniqueFd control_fd_;
  std::vector<UniqueFd> rank_control_fds_;
  std::vector<BellPipe> bells_;
  ControlMapping control_;
  ControlHeader* header_ = nullptr;
  std::unique_ptr<DaemonDoorbell> doorbell_;
  std::vector<UniqueFd> rank_fds_;
  std::vector<Mapping> rank_maps_;
  // GPU path: each rank's device memory (any plan's CUDA buckets fit:
  // MaxPlanBytes(params, kCuda) bytes) and its exported fd until handed out.
  size_t device_region_bytes_ = 0;
  std::vector<std::unique_ptr<DeviceMemoryInterface>> device_memory_;
  std::vector<UniqueFd> device_fds_;
  // bucket_buffers_[b][r]: bucket b inside rank r's mapping.
  std::vector<std::vector<void*>> bucket_buffers_;
  // bcast_areas_[r]: the broadcast area inside rank r's mapping.
  std::vector<void*> bcast_areas_;

  // Each local rank's state, moved by the manager's thread and the engine
  // (rank_states.h), and the restarted ranks waiting for the engine.
  RankStates ranks_;
  RankRestartInbox restart_inbox_;
  std::atomic<uint64_t> iterations_aborted_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;

  // Engine thread only (and before Start).
  BucketPlan plan_;
  std::vector<uint64_t> started_;  // iteration last handed to the reducer
  uint64_t bcast_started_ = 0;     // broadcast last handed to the reducer
  Phase phase_ = Phase::kRunning;
  JoinState join_;
  RankRestarts restarts_;
  PlanSwitch plan_switch_;
  // active_buffers_[b]: bucket b of the ranks active in the running join
  // iteration, active_ranks_[b] those ranks (BucketWork::ranks); join_areas_:
  // their broadcast areas (nullptr for the others); phantom_*: the relay area
  // of a node none of whose ranks is active.
  std::vector<std::vector<void*>> active_buffers_;
  std::vector<std::vector<int>> active_ranks_;
  std::vector<void*> join_areas_;
  std::vector<char> phantom_scratch_;
  std::vector<void*> phantom_areas_;

  // A join round's result, from the reducer's completion (any thread).
  JoinRoundResult round_result_;
  bool hook_resolved_ = false;
  v1::CommHookSpec hook_spec_;  // once resolved

  CommHookSelection hooks_;

  // The used map's parameter (-1: the job has none) and, engine thread
  // only (set by MapBuckets), its bucket and byte offset in the plan.
  int used_map_param_ = -1;
  int used_map_bucket_ = -1;
  size_t used_map_offset_ = 0;

  // What Snapshot, ResponseFor and the events read from other threads:
  // this node's place in the job, the phase, the plan, the used map.
  PublishedState published_;
  // Events (job_events.h): the timeline ring, the stall inspector and the
  // fan-out to them and spec_.events.
  Timeline timeline_;
  StallInspector stalls_;
  JobEventFanOut events_;
  // Autotune (null: the job's cap is fixed); fed by an event sink.
  std::unique_ptr<AutotuneRecord> autotune_;
  // Per bucket of plan_, what the events say of it (bucket_traces.h),
  // handed from the engine thread to the bucket's completion.
  BucketTraces traces_;
  int64_t next_stall_check_ns_ = 0;

  // Serialises failure publication between the engine and manager threads
  // (PublishError's first-failure-wins check is not atomic).
  absl::Mutex error_mu_;

  // Reducer hand-overs not completed yet (reducer_hand_offs.h).
  ReducerHandOvers hand_overs_;
  // Bucket rebuild: the ranks' rebuild expected and the switch waiting
  // (plan_switch_requests.h).
  PlanSwitchRequests switch_requests_;
  // Epochs and re-formation (reformation_driver.h): the stage, what the
  // plain buckets divide by, whether the nodes changed since the job
  // formed; what other threads post about the inter-node group.
  ReformationDriver reformation_;
};

}  // namespace gradd

#endif  // GRADD_SERVER_ENGINE_JOB_JOB_H_
