// The engine side of rank restart (job.h's rank lifecycle;
// common/control_block.h, "Rank restart"): a rank whose session closed is
// waited for, and when it attaches again the engine, at a point where no
// bucket or round is with the reducer, aborts what cannot complete and
// hands the rank rows that say where the job is.
#include <algorithm>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/engine/job/job.h"
#include "server/logging.h"

namespace gradd {

bool Job::RankRestarting(int rank, absl::string_view reason) {
  RankRestarts::Situation in;
  in.has_grace = spec_.rank_restart_grace.count() > 0;
  in.plan_switch_in_play = switch_requests_.in_play();
  in.failed = header_->status.load(std::memory_order_acquire) != 0;
  // A join (uneven inputs) in play: some rank opened a join the
  // daemon has not finished.
  void* base = control_.data();
  const uint64_t done_join =
      layout_.join_board(base)->done_join_seq.load(std::memory_order_acquire);
  for (int r = 0; r < spec_.local_world_size && !in.join_open; ++r) {
    in.join_open = layout_.join_slot(base, r)->join_seq.load(
                       std::memory_order_acquire) > done_join;
  }
  if (!RankRestarts::CanWait(in)) return false;
  const int64_t now = EngineNowNs();
  if (!ranks_.BeginRestart(rank, now)) return false;
  header_->restarting.fetch_add(1, std::memory_order_acq_rel);
  RankRestartEvent e;
  e.local_rank = rank;
  e.since_ns = now;
  e.at_ns = now;
  e.world_size = ranks_world_size();
  e.reason = std::string(reason);
  events_.OnRankRestarting(e);
  doorbell_->Ring();  // the engine re-checks who is stuck
  return true;
}

bool Job::restarting(int rank) const { return ranks_.restarting(rank); }

int Job::restarting_ranks() const { return ranks_.restarting_count(); }

uint64_t Job::restarts() const {
  return header_->restarts.load(std::memory_order_acquire);
}

void Job::RestartRank(int rank, RankRestartDone done) {
  restart_inbox_.Post(rank, std::move(done));
}

bool Job::TryRestartRanks() {
  if (reformation_.enabled()) {
    // Multi-node (job.h "Elastic multi-node jobs"): the rank's return is
    // one re-formation of the job's inter-node group. The draining waits
    // for the quiet point; the rejoin is answered after Reformed.
    std::vector<RankRestartInbox::Request> batch = restart_inbox_.TakeAll();
    const bool any = !batch.empty();
    std::vector<RankRestartInbox::Request> returned;
    for (RankRestartInbox::Request& request : batch) {
      if (!ranks_.restarting(request.rank)) {
        std::move(request.done)(NotRestarting(request.rank));
        continue;
      }
      returned.push_back(std::move(request));
    }
    reformation_.RanksReturned(std::move(returned));
    return any;
  }
  void* base = control_.data();
  std::atomic<uint64_t>* done = layout_.done_seq(base);
  // Nothing may be with the reducer: its completion would publish a done
  // sequence (or a round) under the abort's feet, and a rank's buffer
  // would be read while the new process writes it.
  for (size_t b = 0; b < plan_.buckets.size(); ++b) {
    if (started_[b] > done[b].load(std::memory_order_acquire)) return false;
  }
  if (bcast_started_ >
      header_->bcast_done_seq.load(std::memory_order_acquire)) {
    return false;
  }
  std::vector<RankRestartInbox::Request> batch = restart_inbox_.TakeAll();
  for (RankRestartInbox::Request& request : batch) {
    RestartRankNow(request.rank, std::move(request.done));
  }
  return !batch.empty();
}

Job::Abort Job::AbortInProgress(int aborted_rank) {
  void* base = control_.data();
  std::atomic<uint64_t>* done_seq = layout_.done_seq(base);
  const size_t n = plan_.buckets.size();
  Abort a;

  // 1. The gradient iteration in progress (some bucket done for it), or
  // else the next one, is aborted (RankRestarts::PlanIterationAbort):
  // nobody applies it. Every bucket not done gets done_seq = i without
  // being reduced, the verdict stored first.
  const RankRestarts::IterationAbort planned = RankRestarts::PlanIterationAbort(
      n, [&](size_t b) { return done_seq[b].load(std::memory_order_acquire); });
  a.iteration = planned.iteration;
  if (a.iteration != 0) {
    header_->aborted_rank.store(aborted_rank, std::memory_order_relaxed);
    // A run of consecutive aborts (re-formations one after the other) may
    // find a rank still at the iteration before the first of them.
    restarts_.NoteIterationAbort(header_->aborted_iteration.load(),
                                 a.iteration);
    header_->aborted_iteration.store(a.iteration, std::memory_order_release);
    for (size_t b = 0; b < n; ++b) {
      if (done_seq[b].load(std::memory_order_acquire) < a.iteration) {
        done_seq[b].store(a.iteration, std::memory_order_release);
      }
    }
    // The aborted buckets' waits are over (stall inspector, events).
    traces_.ForgetWaits();
    iterations_aborted_.fetch_add(1, std::memory_order_relaxed);
  }
  a.last = planned.last;

  // 2. The collective round in progress, or else the next one, likewise
  // (the same agreement point for rounds: a survivor's buffer broadcast
  // and the rejoined rank's state sync can never meet in one round).
  a.round = header_->bcast_done_seq.load(std::memory_order_acquire) + 1;
  header_->aborted_rank.store(aborted_rank, std::memory_order_relaxed);
  restarts_.NoteRoundAbort(header_->aborted_round.load(), a.round);
  header_->aborted_round.store(a.round, std::memory_order_release);
  header_->bcast_done_seq.store(a.round, std::memory_order_release);
  a.collective_seq = header_->bcast_done_seq.load(std::memory_order_acquire);
  return a;
}

bool Job::ResetRestartedRank(int rank, const Abort& abort,
                             RankRestartDone* done) {
  void* base = control_.data();
  // 3. The rank's rows say "done with everything so far"; its join state
  // starts over. Written by the daemon against the rule that rank r writes
  // only its own: the new process reads them only once its Attach answers.
  for (size_t b = 0; b < plan_.buckets.size(); ++b) {
    layout_.ready_row(base, rank)[b].store(abort.last,
                                           std::memory_order_release);
  }
  layout_.bcast(base, rank)
      ->ready_seq.store(abort.collective_seq, std::memory_order_release);
  JoinSlot* slot = layout_.join_slot(base, rank);
  slot->join_seq.store(0, std::memory_order_relaxed);
  slot->begin.store(0, std::memory_order_relaxed);
  slot->active_seq.store(0, std::memory_order_relaxed);
  slot->joined_at.store(0, std::memory_order_relaxed);
  slot->sync_bytes.store(0, std::memory_order_relaxed);
  slot->flags.store(0, std::memory_order_relaxed);
  // The dead process may have gone while asleep.
  layout_.rank_header(base, rank)->sleeping.store(0, std::memory_order_relaxed);

  if (!ranks_.EndRestart(rank)) {
    // Gone meanwhile (grace over): what was aborted stays aborted.
    WakeClients(layout_, base);
    std::move (*done)(absl::AbortedError(absl::StrCat(
        RankName(rank), " went away before its return was complete")));
    return false;
  }
  header_->restarting.fetch_sub(1, std::memory_order_acq_rel);
  header_->restarts.fetch_add(1, std::memory_order_acq_rel);
  return true;
}

void Job::RestartRankNow(int rank, RankRestartDone done) {
  if (!ranks_.restarting(rank)) {
    std::move(done)(NotRestarting(rank));
    return;
  }
  const Abort abort = AbortInProgress(rank);
  if (!ResetRestartedRank(rank, abort, &done)) return;
  const uint64_t sync =
      header_->sync_seq.fetch_add(1, std::memory_order_acq_rel) + 1;
  WakeClients(layout_, control_.data());

  const int64_t now = EngineNowNs();
  RankRestartEvent e;
  e.local_rank = rank;
  e.since_ns = ranks_.TakeRestartSince(rank);
  e.at_ns = now;
  e.aborted_iteration = abort.iteration;
  e.aborted_round = abort.round;
  e.world_size = ranks_world_size();
  events_.OnRankRestarted(e);
  spdlog::info(
      "{}",
      absl::StrCat(
          RankName(rank), " restarted: back after ",
          e.since_ns != 0 ? (now - e.since_ns) / 1'000'000 : 0, " ms away; ",
          abort.iteration != 0
              ? absl::StrCat("aborted iteration ", abort.iteration)
              : std::string("no iteration aborted"),
          abort.round != 0
              ? absl::StrCat(", aborted collective round ", abort.round)
              : std::string(),
          "; it goes on at iteration ", abort.last + 1, " after state sync ",
          sync));

  v1::AttachResponse response = ResponseFor(rank);
  response.set_restarted(true);
  response.set_next_iteration(abort.last + 1);
  response.set_collective_seq(abort.collective_seq);
  response.set_sync_seq(sync);
  std::move(done)(std::move(response));
}

void Job::RankBack(RankRestartInbox::Request request, const Abort& abort,
                   const ReformationResult& r) {
  const int rank = request.rank;
  if (!ranks_.restarting(rank)) {
    std::move(request.done)(NotRestarting(rank));
    return;
  }
  if (!ResetRestartedRank(rank, abort, &request.done)) return;
  WakeClients(layout_, control_.data());
  RankRestartEvent e;
  e.local_rank = rank;
  e.since_ns = ranks_.TakeRestartSince(rank);
  e.at_ns = EngineNowNs();
  e.aborted_iteration = abort.iteration;
  e.aborted_round = abort.round;
  e.world_size = ranks_world_size();
  e.with_reformation = true;
  events_.OnRankRestarted(e);
  spdlog::info(
      "{} restarted: back with the re-formation; it goes on at iteration "
      "{} after state sync {}",
      RankName(rank), abort.last + 1, r.sync_seq);
  v1::AttachResponse response = ResponseFor(rank);
  response.set_restarted(true);
  response.set_next_iteration(abort.last + 1);
  response.set_collective_seq(abort.collective_seq);
  response.set_sync_seq(header_->sync_seq.load(std::memory_order_acquire));
  std::move(request.done)(std::move(response));
}

absl::Status Job::NotRestarting(int rank) const {
  return absl::FailedPreconditionError(
      absl::StrCat(RankName(rank), " is not restarting; it cannot rejoin"));
}

}  // namespace gradd
