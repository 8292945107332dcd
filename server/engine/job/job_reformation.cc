// The engine side of node loss and arrival (job.h "Elastic multi-node
// jobs"; common/control_block.h "Re-formation"): a job elastic across nodes
// survives a break of its inter-node group. The engine drains the reducer
// (failures of what was with it are the break's, not the job's), hands the
// break to the re-formation handler with the old reducer destroyed (its
// backend closed, so peers blocked on this node notice at once), and on
// Reformed installs the new reducer, aborts the iteration and collective
// round in progress (or the next ones) once, publishes the new epoch,
// world size and sync_seq, and answers the rejoins that caused or met the
// break.
//
// Threads: RequestReformation, Reformed, the completions' NoteInterNodeError
// and ReducerWorkDone run on any thread and only leave word (reformation_mu_,
// atomics) and ring the engine's doorbell; everything else here runs on
// the engine thread.
#include <algorithm>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/doorbell.h"
#include "server/engine/job/job.h"
#include "server/logging.h"

namespace gradd {
namespace {

bool SamePlan(const BucketPlan& a, const BucketPlan& b) {
  if (a.buckets.size() != b.buckets.size()) return false;
  for (size_t i = 0; i < a.buckets.size(); ++i) {
    if (a.buckets[i].params != b.buckets[i].params) return false;
  }
  return true;
}

void Add(ReducerStats* to, const ReducerStats& s) {
  to->buckets += s.buckets;
  to->local_reduce_ns += s.local_reduce_ns;
  to->network_ns += s.network_ns;
  to->write_back_ns += s.write_back_ns;
}

}  // namespace

void Job::SetReformationHandler(ReformationHandler handler) {
  reform_handler_ = std::move(handler);
}

void Job::RequestReformation(std::string reason) {
  if (!reformable_) return;
  {
    absl::MutexLock lock(&reformation_mu_);
    if (!break_request_.has_value()) break_request_ = std::move(reason);
    network_pending_.store(true, std::memory_order_release);
  }
  doorbell_->Ring();
}

void Job::Reformed(absl::StatusOr<ReformationResult> result) {
  {
    absl::MutexLock lock(&reformation_mu_);
    reformed_ = std::move(result);
    network_pending_.store(true, std::memory_order_release);
  }
  doorbell_->Ring();
}

uint64_t Job::epoch() const {
  return header_->epoch.load(std::memory_order_acquire);
}

ReducerStats Job::reducer_stats() const {
  absl::MutexLock lock(&reducer_mu_);
  ReducerStats s = retired_stats_;
  if (reducer_ != nullptr) Add(&s, reducer_->stats());
  return s;
}

int Job::live_world_size() const {
  absl::MutexLock lock(&live_mu_);
  return live_.world_size;
}

void Job::ReplaceReducer(std::unique_ptr<BucketReducerInterface> reducer) {
  std::unique_ptr<BucketReducerInterface> old;
  {
    absl::MutexLock lock(&reducer_mu_);
    if (reducer_ != nullptr) Add(&retired_stats_, reducer_->stats());
    old = std::move(reducer_);
    reducer_ = std::move(reducer);
  }
  // Outside the lock: joins the old reducer's threads and closes its
  // backend (bounded by its collective timeout).
  old.reset();
}

bool Job::NoteInterNodeError(const absl::Status& status,
                             absl::string_view what) {
  if (!reformable_) return false;
  {
    absl::MutexLock lock(&reformation_mu_);
    // The first error is the break's reason; the rest of the drain echoes
    // it (the hierarchical reducer fails everything after it).
    if (!network_error_.has_value()) network_error_ = std::string(what);
    network_pending_.store(true, std::memory_order_release);
  }
  doorbell_->Ring();
  return true;
}

void Job::ReducerWorkDone() {
  // seq_cst with BeginDraining's store and the engine's load: either the
  // engine sees the count at 0 or this completion sees it draining.
  if (in_flight_.fetch_sub(1) == 1 && draining_.load()) doorbell_->Ring();
}

void Job::FailPendingRankRestarts(const absl::Status& status) {
  std::vector<std::pair<int, RankRestartDone>> batch;
  batch.swap(restarts_in_reformation_);
  for (auto& [rank, done] : batch) std::move(done)(status);
}

void Job::BeginDraining(std::string reason) {
  const std::string in_play = EpochState::Unsurvivable(
      JoinInPlay(), rebuild_after_.load(std::memory_order_acquire) != 0 ||
                        switch_pending_.load(std::memory_order_acquire));
  if (!in_play.empty()) {
    FailOnEngine(
        absl::StatusCode::kAborted,
        absl::StrCat("job '", spec_.job_id, "': the inter-node group broke (",
                     reason, ") while ", in_play,
                     "; elastic re-formation does not run during a "
                     "join or a bucket rebuild"));
    return;
  }
  if (!epoch_.Break(std::move(reason), EngineNowNs())) return;
  draining_.store(true);
  EnterPhase(Phase::kDraining, epoch_.reason());
  // What this node saw, not yet what it was (a peer's connection reset may
  // be its death or its rank restart): the "re-formed" line says that,
  // from the closer's verdict, the same on every node.
  spdlog::info(
      "job '{}': its nodes' group broke at epoch {} (this node saw: {}); "
      "draining, then re-forming",
      spec_.job_id, epoch(), epoch_.reason());
}

bool Job::StepEpoch() {
  std::optional<std::string> error;
  std::optional<std::string> request;
  std::optional<absl::StatusOr<ReformationResult>> reformed;
  if (network_pending_.exchange(false, std::memory_order_acq_rel)) {
    absl::MutexLock lock(&reformation_mu_);
    error.swap(network_error_);
    reformed.swap(reformed_);
    // A request made while a break is under way (draining or re-forming)
    // is dropped: the only caller is the arrival watcher (JobManager),
    // which asks again, once the re-formation is over, for an arrival that
    // the new membership did not settle; keeping the request re-formed the
    // job once more, with the same members, when it had.
    request.swap(break_request_);
  }
  if (reformed.has_value()) {
    if (epoch_.TakeResult()) {
      ApplyReformed(*std::move(reformed));
      if (failed()) return true;
    } else {
      spdlog::warn(
          "job '{}': a re-formation result arrived while none was "
          "under way; ignored",
          spec_.job_id);
    }
  }
  if (epoch_.running()) {
    if (error.has_value()) {
      BeginDraining(*std::move(error));
    } else if (request.has_value()) {
      BeginDraining(*std::move(request));
    }
    if (failed()) return true;
  }
  const bool draining = epoch_.stage() == EpochState::Stage::kDraining;
  if (draining && in_flight_.load() != 0) {
    // What is with the old reducer may never complete by itself: its
    // network order can wait for a bucket this node will never hand over
    // (a rank died in the middle of its backward, and the break is this
    // node's own, so no peer fails it). Stopping the old reducer completes
    // everything queued with CANCELLED (its destructor; a collective
    // running now ends first, bounded by the collective timeout) and
    // closes its backend, so the peers blocked on this node fail at once.
    ReplaceReducer(nullptr);
  }
  if (!epoch_.Drained(in_flight_.load())) return epoch_.under_way();

  // Drained: nothing is with the reducer, and nothing will be.
  std::atomic<uint64_t>* done = layout_.done_seq(control_.data());
  uint64_t completed =
      plan_.buckets.empty() ? 0 : std::numeric_limits<uint64_t>::max();
  for (size_t b = 0; b < plan_.buckets.size(); ++b) {
    completed = std::min(completed, done[b].load(std::memory_order_acquire));
  }
  ReformationRequest broken;
  broken.reason = epoch_.reason();
  broken.completed_iteration = completed;
  broken.sync_seq = header_->sync_seq.load(std::memory_order_acquire);
  broken.epoch = epoch();
  for (const auto& [rank, done] : restarts_in_reformation_) {
    broken.restarted_local_ranks.push_back(rank);
  }
  NetworkReformEvent e;
  e.epoch = broken.epoch;
  e.reason = epoch_.reason();
  e.broke_ns = epoch_.broke_ns();
  e.at_ns = epoch_.broke_ns();
  events_.OnNetworkBroken(e);
  // The old group is done with: closing its backend tells the peers still
  // blocked on this node at once (a break this node started has not
  // reached them yet).
  ReplaceReducer(nullptr);
  EnterPhase(Phase::kReforming,
             absl::StrCat("drained, iteration ", completed, " complete"));
  if (!reform_handler_) {
    FailOnEngine(
        absl::StatusCode::kAborted,
        absl::StrCat("job '", spec_.job_id, "': the inter-node group broke (",
                     epoch_.reason(), ") and nothing re-forms it"));
    return true;
  }
  spdlog::debug(
      "job '{}': drained after the break (iteration {} complete); "
      "re-forming",
      spec_.job_id, completed);
  reform_handler_(std::move(broken));
  return true;
}

void Job::ApplyReformed(absl::StatusOr<ReformationResult> result) {
  auto fail = [&](absl::string_view why) {
    const std::string message =
        absl::StrCat("job '", spec_.job_id, "': re-formation after the break (",
                     epoch_.reason(), ") failed: ", why);
    FailOnEngine(absl::StatusCode::kAborted, message);
    const absl::Status status = absl::AbortedError(message);
    FailPendingRankRestarts(status);
    AbortRankRestarts(status);
  };
  if (!result.ok()) {
    fail(result.status().message());
    return;
  }
  ReformationResult& r = *result;
  if (r.reducer == nullptr) {
    fail("no reducer for the new group");
    return;
  }
  ReplaceReducer(std::move(r.reducer));
  // What the re-formation was: the closer's line (this node's own view of
  // the break only when the result carries none).
  const std::string& what = r.reason.empty() ? epoch_.reason() : r.reason;
  std::vector<std::string> lost_now;  // every node lost and not back
  {
    absl::MutexLock lock(&live_mu_);
    live_.node_rank = r.node_rank;
    live_.num_nodes = r.num_nodes;
    live_.world_size = r.world_size;
    live_.node_ids = r.node_ids;
    // With a known cause, the closer's list, the same on every node (an
    // admitted node's too); else this node's list, moved by the lost and
    // admitted ones.
    EpochState::Membership m;
    m.cause_known = r.cause != ReformCause::kUnknown;
    m.departed = r.departed;
    m.lost = r.lost;
    m.admitted = r.admitted;
    live_.lost = EpochState::LostAfter(std::move(live_.lost), m);
    live_.last_reason = what;
    lost_now = live_.lost;
  }
  // The new reducer divides by the live world size; a job that divides by
  // the initial one says so per bucket.
  epoch_.SetWorld(
      EpochState::MembershipChanged(r.node_ids, spec_.node_ids, r.world_size,
                                    spec_.global_world_size()),
      EpochState::BucketDivisor(spec_.divide_by_initial_world_size,
                                spec_.initial_global_world_size()));
  // The job's hook, chosen before the break, carries over, but it is
  // settled again with the new group when the next bucket is about to
  // start (ResolveCommHook), as for a new job: a node admitted into the
  // job chooses its hook only then, and agreeing here would wait for it
  // in vain (its ranks first run the state sync).
  hook_resolved_ = false;

  // The one abort of the re-formation (control_block.h "Re-formation"),
  // then the new group's words, sync_seq last.
  const Abort abort = AbortInProgress(/*aborted_rank=*/-1);
  // The new reducer's sequence starts after the aborted iteration (its
  // network order counts iterations), from the plan the job formed with.
  reducer_->StartAt(abort.last + 1);
  if (!SamePlan(plan_, spec_.plan)) {
    reducer_->Replan(abort.last + 1, static_cast<int>(plan_.buckets.size()));
  }
  header_->epoch.store(r.epoch, std::memory_order_relaxed);
  header_->world_size.store(static_cast<uint32_t>(r.world_size),
                            std::memory_order_relaxed);
  header_->state_behind.store(r.behind ? 1 : 0, std::memory_order_relaxed);
  header_->sync_seq.store(r.sync_seq, std::memory_order_release);
  WakeClients(layout_, control_.data());

  const int64_t now = EngineNowNs();
  NetworkReformEvent e;
  e.epoch = r.epoch;
  e.reason = what;
  e.cause = r.cause;
  e.broke_ns = epoch_.broke_ns();
  e.at_ns = now;
  e.lost = r.lost;
  e.admitted = r.admitted;
  e.node_ids = r.node_ids;
  e.lost_node_ids = std::move(lost_now);
  e.num_nodes = r.num_nodes;
  e.world_size = r.world_size;
  e.aborted_iteration = abort.iteration;
  e.aborted_round = abort.round;
  events_.OnNetworkReformed(e);
  // The one line that says what the re-formation was (the closer's words,
  // the same on every node): a warning when a node was lost.
  spdlog::log(
      r.cause == ReformCause::kNodeLost ? spdlog::level::warn
                                        : spdlog::level::info,
      "{}",
      absl::StrCat(
          "job '", spec_.job_id, "' re-formed (epoch ", r.epoch, ") after ",
          epoch_.ElapsedMs(now), " ms: ", what, " (", ReformCauseName(r.cause),
          "); node rank ", r.node_rank, " of ", r.num_nodes, ", world size ",
          r.world_size,
          r.lost.empty() ? std::string()
                         : absl::StrCat(", lost ", absl::StrJoin(r.lost, ", ")),
          r.admitted.empty()
              ? std::string()
              : absl::StrCat(", admitted ", absl::StrJoin(r.admitted, ", ")),
          abort.iteration != 0
              ? absl::StrCat("; aborted iteration ", abort.iteration,
                             ", goes on at iteration ", abort.last + 1)
              : std::string(),
          "; aborted collective round ", abort.round, "; state sync ",
          r.sync_seq, r.behind ? " (this node is behind)" : ""));

  epoch_.Resume();
  draining_.store(false);
  EnterPhase(Phase::kRunning, absl::StrCat("re-formed at epoch ", r.epoch));

  // The ranks whose return caused or met this break: the re-formation's
  // abort and agreed sync_seq are theirs too.
  {
    absl::MutexLock lock(&restart_mu_);
    for (auto& entry : pending_restarts_)
      restarts_in_reformation_.push_back(std::move(entry));
    pending_restarts_.clear();
    rejoin_pending_.store(false, std::memory_order_release);
  }
  std::vector<std::pair<int, RankRestartDone>> batch;
  batch.swap(restarts_in_reformation_);
  for (auto& [rank, done] : batch) {
    if (rank_state_[rank].load() != kRestarting) {
      std::move(done)(absl::FailedPreconditionError(absl::StrCat(
          RankName(rank), " is not restarting; it cannot rejoin")));
      continue;
    }
    if (!ResetRestartedRank(rank, abort, &done)) continue;
    WakeClients(layout_, control_.data());
    RankRestartEvent re;
    re.local_rank = rank;
    re.since_ns =
        restart_since_ns_[rank].exchange(0, std::memory_order_relaxed);
    re.at_ns = now;
    re.aborted_iteration = abort.iteration;
    re.aborted_round = abort.round;
    re.world_size = live_world_size() - (spec_.local_world_size - live_ranks());
    re.with_reformation = true;
    events_.OnRankRestarted(re);
    spdlog::info(
        "{} restarted: back with the re-formation; it goes on at iteration "
        "{} after state sync {}",
        RankName(rank), abort.last + 1, r.sync_seq);
    v1::AttachResponse response = ResponseFor(rank);
    response.set_restarted(true);
    response.set_next_iteration(abort.last + 1);
    response.set_collective_seq(abort.collective_seq);
    response.set_sync_seq(header_->sync_seq.load(std::memory_order_acquire));
    std::move(done)(std::move(response));
  }
}

}  // namespace gradd
