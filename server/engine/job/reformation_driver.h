// The engine's side of node loss and arrival for a job re-formable across
// nodes (job.h "Elastic multi-node jobs"; common/control_block.h
// "Re-formation"): what the engine does at a break of the job's inter-node
// group and with the re-formation's result.
//
//   running --inter-node error / request / a rank's return (Break)-->
//   draining: nothing new to the reducer; what is with it completes (or
//             is cancelled: the old reducer is stopped), its failures are
//             the break's --nothing with the reducer-->
//   reforming: the old reducer destroyed (its backend closed, so peers
//             blocked on this node notice at once), the handler told
//             (ReformationRequest) --result ok--> the new reducer, the
//             layout, the one abort and the new group's words (JobSide),
//             running again; the ranks whose return met the break
//             answered --result error / no handler--> the job fails
//
// A job that cannot survive a break now (a join or a plan switch in play,
// EpochState::Unsurvivable) fails instead of draining.
//
// Owns: the re-formation's stage (EpochState), the inbox other threads
// post to (ReformationInbox), the handler and the restarted ranks waiting
// for the re-formation. Given (outliving it): the job's reducer slot and
// hand-over count, its plan-switch requests and rank-restart inbox (read
// and taken only), its published layout, its events, a clock, and the
// JobSide: the few things only the job can do with its memory and phase.
//
// Threads: the inbox from any thread; everything else on the engine thread
// (and before Start). No call here runs per bucket: the engine's hot path
// reads only epoch() (the divisor), non-virtual.
#ifndef GRADD_SERVER_ENGINE_JOB_REFORMATION_DRIVER_H_
#define GRADD_SERVER_ENGINE_JOB_REFORMATION_DRIVER_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/engine/job/epoch_state.h"
#include "server/engine/job/job_snapshot.h"
#include "server/engine/job/plan_switch_requests.h"
#include "server/engine/job/published_state.h"
#include "server/engine/job/rank_restarts.h"
#include "server/engine/job/rank_states.h"
#include "server/engine/job/reducer_hand_offs.h"
#include "server/engine/job/reformation_inbox.h"
#include "server/engine/observe/job_events.h"

namespace gradd {

class ReformationDriver {
 public:
  // What the driver needs of its job (Job implements it; tests fake it).
  // Engine thread, called only at a break or a result.
  class JobSide {
   public:
    virtual ~JobSide() = default;
    // A join (uneven inputs) runs or some rank opened one.
    virtual bool JoinInPlay() = 0;
    // The job's one transition function (Job::EnterPhase).
    virtual void EnterPhase(JobPhase next, absl::string_view why) = 0;
    // Fails the job, ABORTED with `message` (Job::FailOnEngine).
    virtual void FailJob(absl::string_view message) = 0;
    // The control block now: the iteration every bucket is done for, the
    // state sync and the epoch (ReformationRequest's fields).
    virtual ReformationRequest ReadControl() = 0;
    // The memory's side of a successful re-formation, once the new reducer
    // is in place: the one abort of the iteration and round in progress
    // (or the next), the new reducer's sequence after it, the hook settled
    // again, and the new group's words in the control block (epoch, world
    // size, state_behind, sync_seq last); wakes the ranks.
    virtual RankRestarts::Aborted StartNewGroup(
        const ReformationResult& result) = 0;
    // Restarted rank `request.rank`, whose return met this re-formation:
    // back with its abort and agreed sync_seq, answered (an error when it
    // is not restarting any more).
    virtual void RankBack(RankRestartInbox::Request request,
                          const RankRestarts::Aborted& abort,
                          const ReformationResult& result) = 0;
  };

  // What of the job the rules after a re-formation need.
  struct Options {
    std::string job_id;
    // The job survives node loss and arrival (Job: num_nodes > 1 and
    // min_nodes > 0 or a rank restart grace). Otherwise Step never runs.
    bool enabled = false;
    // The node ids and global world size this node formed with, whether
    // the job divides by its initial world size, and that size.
    std::vector<std::string> formed_node_ids;
    int formed_world_size = 1;
    bool divide_by_initial_world_size = false;
    int initial_world_size = 0;
    // The divisor to start with (a node admitted into its running job).
    double bucket_divisor = 0;
  };
  struct Parts {
    JobSide* job = nullptr;
    ReducerSlot* reducer = nullptr;
    ReducerHandOvers* hand_overs = nullptr;
    const PlanSwitchRequests* plan_switch = nullptr;
    RankRestartInbox* restarts = nullptr;
    PublishedState* published = nullptr;
    JobEventSinkInterface* events = nullptr;
    std::function<int64_t()> now_ns;  // engine clock
  };
  // `wake` rings the engine (the inbox's posts).
  ReformationDriver(Options options, Parts parts,
                    absl::AnyInvocable<void()> wake);
  ReformationDriver(const ReformationDriver&) = delete;
  ReformationDriver& operator=(const ReformationDriver&) = delete;

  bool enabled() const { return epoch_.enabled(); }
  // The stage, the divisor, whether the membership changed.
  const EpochState& epoch() const { return epoch_; }
  // Any thread: errors, requests and results for the engine.
  ReformationInbox& inbox() { return inbox_; }

  using Handler = absl::AnyInvocable<void(ReformationRequest)>;
  // Before Start: runs once per break, when the reducer is drained; the
  // receiver re-forms (off the engine thread) and posts the result.
  void SetHandler(Handler handler) { handler_ = std::move(handler); }

  // Engine thread, each turn of a running (not failed) job's loop:
  // advances the re-formation. True while the engine must start nothing
  // (draining or reforming) or the job failed here.
  bool Step();
  // Engine thread: restarting ranks attached again (each checked by the
  // caller): their return is one re-formation (reason "local rank r
  // restarted"), after which they are answered.
  void RanksReturned(std::vector<RankRestartInbox::Request> returned);
  // The ranks waiting for the re-formation, answered with `status` (the
  // job failed).
  bool has_returned_ranks() const { return !returned_.empty(); }
  void FailReturnedRanks(const absl::Status& status);
  // The job stopped: the ranks waiting answered with `status`, a result
  // not applied dropped (its reducer never ran anything).
  void Close(const absl::Status& status);

 private:
  // running -> draining for `reason`; false when the job failed instead.
  bool BeginDraining(std::string reason);
  // reforming -> running with `result`; false when the job failed.
  bool Apply(absl::StatusOr<ReformationResult> result);
  // Drained: the handler is told. False when the job failed instead.
  bool HandOver();

  const Options options_;
  const Parts parts_;
  EpochState epoch_;
  ReformationInbox inbox_;
  Handler handler_;
  std::vector<RankRestartInbox::Request> returned_;
};

}  // namespace gradd

#endif  // GRADD_SERVER_ENGINE_JOB_REFORMATION_DRIVER_H_
